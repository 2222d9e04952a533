"""The Dash dashboard: `app.create_app(db_path)`; it draws analysis results and computes nothing."""
