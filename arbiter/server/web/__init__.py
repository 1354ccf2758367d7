"""The read-only web view (DESIGN §15): HTML pages and a server-sent event
stream, a sub-application mounted at `/view` on the metrics listener with
`--web-view loopback|token` (`app.web_app`).

    access.py   who sees which queues (the debug API's guard and reviews)
    pages.py    the HTML of each page, from the debug API's documents
    live.py     the event stream: counts pushed when the store changes
    app.py      the routes
"""
