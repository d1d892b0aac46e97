"""Test helpers, imported as ``tests.helpers.<module>`` from every test (one import style)."""
