-- Rate and concurrency limits at tenant level, and token-bucket bursts. A NULL limit
-- means none. rpm is the refill rate (requests per minute); *_burst the bucket's
-- capacity (default: the rpm itself, i.e. a full minute's worth at once).
ALTER TABLE tenants
    ADD COLUMN rpm integer CHECK (rpm >= 0),
    ADD COLUMN rpm_burst integer CHECK (rpm_burst >= 0),
    ADD COLUMN tpm integer CHECK (tpm >= 0),
    ADD COLUMN concurrency integer CHECK (concurrency >= 0);

ALTER TABLE api_keys
    ADD COLUMN rpm_burst integer CHECK (rpm_burst >= 0);
