"""Service proxying: service-port/endpoint model, planner, packet tracer (pure)."""
