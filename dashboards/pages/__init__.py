"""One module per dashboard page, registered by its line in app.PAGES: `PATH`, `NAME` (its link
in the page bar), `TITLE`, `register(app)` and `layout(rank=None, step=None, **_)`."""
