"""Agent tools (upstream's package path: ``mindspeed_rl.tools.<module>.<Class>`` in a tool config YAML).

``balance_report`` and ``memory_plan`` here are the old paths of the reports (``mindspeed_rl.reports``), kept so
their ``python -m`` commands still work."""
