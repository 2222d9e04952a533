"""One module per dashboard page: `register(app)` plus `layout(rank=None, step=None, **_)`."""
