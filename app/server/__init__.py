"""Assembly of the HTTP application: `create_app()` and the plumbing it registers."""
