"""The read-only web view (DESIGN §15): HTML pages and a server-sent event
stream, a sub-application mounted at `/view` on the metrics listener with
`--web-view loopback|token` (`app.web_app`).

    access.py   who sees which queues (the debug API's guard and reviews)
    pages.py    the queues page and a queue's, from the debug API's documents
    unit.py     a unit's page: its state, timeline, pod sets and plan
    cluster.py  pools and nodes; the loop's recent decisions
    history.py  each queue's share over the last hour (sparklines, charts)
    live.py     the event stream: counts pushed when the store changes
    app.py      the routes
"""
