"""``coevolve view``: a read-only web view of a warehouse (runs, rounds, episodes, where each task came from).

`app` builds the FastAPI application over a warehouse; `serve` runs it with uvicorn on 127.0.0.1;
`queries` holds every SQL statement it runs, `charts` the curves it draws. docs/view.md shows the pages.
"""
