"""The HTTP edge: routers, auth, request validation; no business logic."""
