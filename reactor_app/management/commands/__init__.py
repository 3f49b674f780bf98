"""``manage.py`` commands shipped with reactor_app."""
