"""The DSL layer: how users declare reactors, steps, arguments and coordination."""
