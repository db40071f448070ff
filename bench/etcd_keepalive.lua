-- wrk script: etcd 3.4 lease keep-alive through the HTTP gateway, on a random lease of those
-- listed (one decimal ID a line) in the file named by $LEASES_FILE.
local ids = {}
for line in io.lines(os.getenv("LEASES_FILE")) do
  ids[#ids + 1] = line
end
math.randomseed(os.time())
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local id = ids[math.random(#ids)]
  return wrk.format(nil, "/v3/lease/keepalive", nil, '{"ID":"' .. id .. '"}')
end
