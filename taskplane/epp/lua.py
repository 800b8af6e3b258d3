"""The Lua filter Envoy runs on streamed answers: the per-chunk work, out of Python.

It passes every chunk through unbuffered (``bodyChunks``) and only looks for three
things, with plain substring searches: the first content event (time to first token,
milliseconds since the epoch), the usage event (its token counts; the event is removed
when the client did not ask for usage, as the Python relay did) and ``[DONE]`` (the
stream finished). A stream the replica ends without ``[DONE]`` (and without an error
event of its own) gets the Python relay's closing ``data: {"error": ...}`` event in its last
chunk; ``ended`` says the replica ended it rather than a reset. (A reset after the
response started cannot be answered so: Envoy's filter manager resets the client's
stream too, and no Lua code runs after it.) The findings go into the ``taskplane`` dynamic-metadata namespace,
which the gRPC access log carries to the picker, which writes the attempt's row.
The picker marks a call as streamed (``stream``) and says whether to hide usage
(``hide_usage``) in the same namespace when it routes the call.

On taskplane's own Envoy no picker message sees a successful stream's response headers
(one message per stream: the request body), so this filter adds them: the route names the
endpoint that answered in ``x-taskplane-upstream`` (``%UPSTREAM_REMOTE_ADDRESS%``), which
it removes, and the routing answer left, per listed endpoint, that endpoint's
``X-Taskplane-*`` headers in the ``taskplane.endpoints`` namespace. It adds them, with
``cache-control: no-cache``, to a 200 ``text/event-stream`` answer only, the answers
the answers filter skips; any other answer gets its headers from the picker. (A
GIE-style Envoy with response headers through the picker names the replica in
``replica`` instead.)
"""

from __future__ import annotations

USAGE_LUA = r"""
local function now_ms(h)
  local ok, t = pcall(function() return h:timestamp() end)
  if ok and t then return t end
  return 0
end

local function drop_usage_event(s)
  -- remove a 'data: {...,"choices":[],...,"usage":{...}}' event (usage-only chunk)
  local out = {}
  local pos = 1
  while true do
    local a, b = string.find(s, "\n\n", pos, true)
    local ev
    if a == nil then ev = string.sub(s, pos) else ev = string.sub(s, pos, b) end
    if not (string.find(ev, '"usage"', 1, true) and string.find(ev, '"choices":[]', 1, true)) then
      out[#out + 1] = ev
    end
    if a == nil then break end
    pos = b + 1
  end
  return table.concat(out)
end

local function put(h, key, value)
  -- fetched anew each time: objects from before a yield (bodyChunks) are out of scope
  h:streamInfo():dynamicMetadata():set("taskplane", key, value)
end

function envoy_on_request(h)
end

local function add_endpoint_headers(h, headers, upstream)
  -- a successful stream's X-Taskplane-* headers, as the routing answer left them for
  -- the endpoint that answered; the replica's name, or nil
  if upstream == nil or headers:get(":status") ~= "200" then return nil end
  local ct = headers:get("content-type") or ""
  if string.sub(ct, 1, 17) ~= "text/event-stream" then return nil end
  local eps = h:streamInfo():dynamicMetadata():get("taskplane.endpoints")
  local ep = eps and eps[upstream]
  if ep == nil then return nil end
  for k, v in pairs(ep) do headers:replace(k, v) end
  headers:replace("cache-control", "no-cache")
  return ep["x-taskplane-replica"]
end

function envoy_on_response(h)
  local headers = h:headers()
  local upstream = headers:get("x-taskplane-upstream")
  if upstream ~= nil then headers:remove("x-taskplane-upstream") end
  local md = h:streamInfo():dynamicMetadata():get("taskplane")
  if md == nil or not md["stream"] then
    return
  end
  local named = add_endpoint_headers(h, headers, upstream)
  local hide = md["hide_usage"] and true or false
  local sse = headers:get(":status") == "200"
  local first = nil
  local carry = ""
  local events = 0
  local done = false
  local reported = false
  local last = nil
  for chunk in h:bodyChunks() do
    last = chunk
    local n = chunk:length()
    if n > 0 then
      local s = chunk:getBytes(0, n)
      if first == nil and (string.find(s, '"content"', 1, true) or string.find(s, '"text"', 1, true)) then
        first = now_ms(h)
        put(h, "first_token_ms", first)
      end
      local _, nc = string.gsub(s, '"content"', "")
      local _, nt = string.gsub(s, '"text"', "")
      if nc + nt > 0 then
        events = events + nc + nt
        put(h, "events", events)  -- content events so far: the tokens of a stream the client left
      end
      local scan = carry .. s
      if string.find(scan, '"usage"', 1, true) then
        local p = string.match(scan, '"prompt_tokens":%s*(%d+)')
        local c = string.match(scan, '"completion_tokens":%s*(%d+)')
        local k = string.match(scan, '"cached_tokens":%s*(%d+)')
        if p then put(h, "prompt_tokens", tonumber(p)) end
        if c then put(h, "completion_tokens", tonumber(c)) end
        if k then put(h, "cached_tokens", tonumber(k)) end
        if hide and string.find(s, '"usage"', 1, true) then
          chunk:setBytes(drop_usage_event(s))
        end
      end
      if string.find(scan, "data: [DONE]", 1, true) then
        done = true
        put(h, "done", true)
      elseif string.find(scan, 'data: {"error"', 1, true) then
        reported = true
        put(h, "stream_error", true)
      end
      carry = string.sub(s, -64)
    end
  end
  -- The replica ended the stream (a reset never gets here: Envoy resets the client too).
  -- Without [DONE] or its own error event the client is told, as the Python relay does,
  -- in the last chunk, which is still this filter's to change until the loop returns.
  put(h, "ended", true)
  if sse and not done and not reported and last ~= nil then
    local replica = named or md["replica"] or "?"
    local event = 'data: {"error": {"type": "replica_error", "message": "replica ' .. replica ..
      ' ended the stream before it finished"}}\n\n'
    local n = last:length()
    if n > 0 then event = last:getBytes(0, n) .. event end
    last:setBytes(event)
  end
end
"""


#: The request guard of the one-message exchange (``envoy_names.GUARD_FILTER``, after the
#: routing ext_proc filter). It holds the request's headers until its body has passed the
#: picker (the routing filter skips the headers and lets them on at once). A request the picker routed carries its call key in the
#: ``taskplane`` metadata; one without it never reached the picker (Envoy sends a body-less
#: request no message when the headers are skipped) and gets the picker's own answer to a
#: body-less call instead of going to a replica unauthenticated. The picker removed the
#: headers it was sent; the client's others of the kind the replica must not see
#: (``x-taskplane-*``, ``x-envoy-*``, ``authorization``, ``x-prefiller-host-port``: only the
#: picker names a prefill replica) go here, and the headers the routing
#: answer sets (the destination, Envoy's retry count: ``taskplane.request``; Envoy applies no
#: header mutation of a body answer to headers it has let on) are set here.
GUARD_LUA = r"""
local BODY_LESS = '{"error": {"type": "invalid_request", "message": "request body is missing"}}'

function envoy_on_request(h)
  -- With its headers skipped the routing filter lets them on at once and holds only the
  -- body; holding them here until the body (answered by the picker) arrives keeps them from
  -- the router until the picker's mutations (the destination) are in.
  h:body()
  local md = h:streamInfo():dynamicMetadata():get("taskplane")
  if md == nil or md["call"] == nil then
    h:respond({[":status"] = "400", ["content-type"] = "application/json"}, BODY_LESS)
    return
  end
  local headers = h:headers()
  local set = h:streamInfo():dynamicMetadata():get("taskplane.request") or {}
  local drop = {}
  for key, _ in pairs(headers) do
    if key == "authorization" or key == "x-prefiller-host-port" or string.sub(key, 1, 12) == "x-taskplane-"
        or string.sub(key, 1, 8) == "x-envoy-" then
      drop[#drop + 1] = key
    end
  end
  for _, key in ipairs(drop) do headers:remove(key) end
  for key, value in pairs(set) do headers:replace(key, value) end
end

function envoy_on_response(h)
end
"""


def attribute_safe_lua(names: tuple[str, ...]) -> str:
    """The usage filter's script for the one-message exchange: the same, and on the request
    the headers sent as attributes (``names``) made valid UTF-8. Envoy sends an attribute as
    a protobuf string, and a header value that is not UTF-8 (a raw latin-1 byte) made the
    whole message unreadable to the picker (503); each byte >= 0x80 is sent as the
    character of that code point instead, which the picker turns back into the header
    message's reading of the bytes (``protocol.attribute_headers``). It also ends the
    upload's clock: it waits for the whole body (buffered here, before the routing filter,
    so the picker still gets one message), marks the stream ``uploaded`` in the ``taskplane``
    metadata and clears the route cache, so the route without the upload limit applies
    before the picker holds the call (``envoy_names.UPLOADED_KEY``)."""
    listed = ", ".join(f'"{n}"' for n in names)
    return USAGE_LUA + f"""
local ATTRIBUTE_HEADERS = {{{listed}}}

local function latin1_to_utf8(s)
  return (string.gsub(s, "[\\128-\\255]", function(c)
    local b = string.byte(c)
    return string.char(192 + math.floor(b / 64), 128 + b % 64)
  end))
end

function envoy_on_request(h)
  local headers = h:headers()
  for _, name in ipairs(ATTRIBUTE_HEADERS) do
    local v = headers:get(name)
    if v ~= nil and string.find(v, "[\\128-\\255]") then headers:replace(name, latin1_to_utf8(v)) end
  end
  -- The body deadline: the route matched so far bounds the stream to the upload limit
  -- (max_stream_duration); once the body is whole, the route is chosen again and the
  -- uploaded one has no such limit, so admission may hold the call (``envoy_config``).
  h:body()
  h:streamInfo():dynamicMetadata():set("taskplane", "uploaded", true)
  h:clearRouteCache()
end
"""
