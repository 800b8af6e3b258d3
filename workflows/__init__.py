"""Temporal workflows, activities and the worker for taskplane agent tasks."""
