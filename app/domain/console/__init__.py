"""The admin console: a static page at /admin over the admin API, and the reads it browses by."""
