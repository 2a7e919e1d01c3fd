"""The client's version: the server's, since the two are released together (a test checks they are equal)."""

VERSION = "0.1.0"
