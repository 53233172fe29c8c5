"""Command-line tools (reports) built on the mindspeed_rl library."""
