"""OpenTelemetry tracing of kvrelay jobs, across the queue hop (docs/deploy.md, Tracing).

Off unless OpenTelemetry's SDK is installed and configured (``switch``). Nothing in this
package imports ``opentelemetry`` at module import: each module does so inside the
functions that only run once tracing is on, so ``import kvrelay`` stays light.

- ``switch``: whether tracing is on, and the tracer (set up from ``OTEL_*`` variables
  or ``KVRELAY_TRACES_FILE`` when the application installed no tracer provider);
- ``carrier``: the job's W3C trace context in and out of ``GenerateRequest``;
- ``attributes``: span attribute names (OpenTelemetry's GenAI conventions) and values;
- ``job_trace``: the caller's spans of one job (the call, admission, delivery);
- ``caller_context``: the synchronous client's caller context carried onto its loop.

The worker's spans of a run are made in ``kvrelay_worker.jobs.run_trace``.
"""
