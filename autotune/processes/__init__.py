"""Processes: those autotune starts (servers, verifier workers, a user's commands) end
with it, even when it is killed with SIGKILL; its own runs its asyncio work to the end."""
