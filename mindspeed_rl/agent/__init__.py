"""Multi-turn rollouts with tools: conversations, the turn rule, tool calls beside the engine."""
