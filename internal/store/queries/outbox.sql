-- name: InsertOutboxMessages :exec
-- Every message of one transaction in one statement (and so one NOTIFY).
-- Set-returning functions in a select list advance together, so row i takes
-- element i of every array.
INSERT INTO message_outbox (
    outbox_id, aggregate_type, aggregate_id, message_type, message_version,
    exchange_name, routing_key, payload, headers
)
SELECT unnest(@outbox_ids::uuid[]),
       unnest(@aggregate_types::text[]),
       unnest(@aggregate_ids::text[]),
       unnest(@message_types::text[]),
       unnest(@message_versions::integer[]),
       unnest(@exchange_names::text[]),
       unnest(@routing_keys::text[]),
       unnest(@payloads::jsonb[]),
       unnest(@headers::jsonb[]);
