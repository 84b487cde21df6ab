"""``runner view``: a local, read-only web app over the store (runner/view/app.py: routes; queries.py: the paged
reads; templates/: the pages). The command is runner/cli_view.py."""
