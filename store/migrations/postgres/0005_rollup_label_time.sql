-- samewise schema v5: the rollup label tables by time. The overview sums every endpoint's
-- labelled counts over a time range; with only the (endpoint, time, dim, label) primary key
-- that read scanned the whole table (all endpoints, all retained time), growing with history
-- instead of with the range.
CREATE INDEX endpoint_minute_labels_minute ON endpoint_minute_labels (minute_ms);
CREATE INDEX endpoint_hour_labels_hour ON endpoint_hour_labels (hour_ms);
