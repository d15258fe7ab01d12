# OpenTelemetry traces (#21, item 5): spec/integration/scale_traces.test.mjs against a
# small OTLP/HTTP receiver in the test, the whole pipeline on spec/run.sh's Postgres and
# Redis; the traceparent parser's unit tests. Labels `scale` (the issue) and `traces`.
# Included by spec/CMakeLists.txt.
tg_services_test(scale_traces ${CMAKE_CURRENT_SOURCE_DIR}/integration/scale_traces.test.mjs "scale;traces;integration" 120)
tg_unit_test(trace "scale;traces")
