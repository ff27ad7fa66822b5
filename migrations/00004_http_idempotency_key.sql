-- Idempotency-Key for POST /v1/orders: the first response to a key is stored
-- in the same transaction as the order it created, so a replay returns it
-- byte for byte and creates nothing. The primary key decides which of two
-- concurrent requests with one key wins.

-- +goose Up
CREATE TABLE http_idempotency_key (
    idempotency_key   text        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    request_method    text        NOT NULL,
    request_path      text        NOT NULL,
    request_hash      text        NOT NULL, -- sha256 of the canonical request body
    response_status   integer,              -- NULL until the first request completes
    response_body     bytea,
    response_location text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_method, request_path, idempotency_key)
);

CREATE INDEX http_idempotency_key_created_idx ON http_idempotency_key (created_at);

-- +goose Down
DROP TABLE http_idempotency_key;
