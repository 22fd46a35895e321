"""The processes autotune starts (servers, verifier workers, a user's commands): each one
ends with autotune, even when autotune is killed with SIGKILL."""
