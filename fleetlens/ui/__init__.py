"""The web portal: HTML pages for researchers, on-call and capacity planners (``pages.router``)."""
