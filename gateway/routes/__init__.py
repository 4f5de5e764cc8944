"""One router per resource of the REST API."""
