"""``runner view``: a local, read-only web app over the store (runner/view/app.py: routes; templates/: the pages).
Its paged reads are the store's (runner/store/view_reads.py); the command is runner/cli/view.py."""
