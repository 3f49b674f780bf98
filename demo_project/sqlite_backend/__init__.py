"""Django 4.2's SQLite backend with what Django 5.1 spells as ``OPTIONS`` (see ``base``)."""
