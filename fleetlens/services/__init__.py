"""Services: read models that compose analyses over the stores, the monitoring loop.

The layer between the API and the stores/analyses: it may import `store` and `analysis`, never
`api`, `ui` or `cli`.
"""
