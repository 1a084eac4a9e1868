"""Operating runifold: health checks (``doctor``), log formats (``log_format``), the demo."""
