-- wrk script: POST the bytes of a file on every request, print a JSON summary at the end.
-- Usage: wrk -t1 -cN -dS --latency -s bench/harness/wrk_post.lua URL -- BODY_FILE CONTENT_TYPE ['Name: value' ...]
-- Arguments after the content type are extra request headers (e.g. the Open Inference Protocol's
-- 'Inference-Header-Content-Length: 123' of a binary tensor body).
local body_file, content_type

function init(args)
  body_file = args[1]
  content_type = args[2] or "application/octet-stream"
  local f = assert(io.open(body_file, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = content_type
  for i = 3, #args do
    local name, value = args[i]:match("^([^:]+):%s*(.*)$")
    assert(name, "extra header '" .. args[i] .. "' is not of the form 'Name: value'")
    wrk.headers[name] = value
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_s": %.6f, "non_2xx": %d, "connect_errors": %d, "read_errors": %d, ' ..
    '"write_errors": %d, "timeouts": %d, "p50_s": %.6f, "p90_s": %.6f, "p99_s": %.6f, "max_s": %.6f}\n',
    summary.requests, summary.duration / 1e6, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50) / 1e6, latency:percentile(90) / 1e6, latency:percentile(99) / 1e6,
    latency.max / 1e6))
end
