-- wrk script: ttlwheel single heartbeats, as `ttlwheel-load heartbeat` sends them: a random key
-- of load-0 .. load-(KEYS-1) (KEYS from the environment, default 100000), TTL 600 s.
local keys = tonumber(os.getenv("KEYS") or "100000")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local key = "load-" .. math.random(0, keys - 1)
  return wrk.format(nil, "/v1/heartbeats", nil, '{"key":"' .. key .. '","ttl_s":600}')
end
