"""The job store's Lua scripts: each runs atomically inside Redis, so a state change, a claim,
a fenced progress write or a node heartbeat either happens whole or not at all.

Used by store/job_store.py and the reads it inherits, store/job_reads.py (registered once
per client, by JobStore).
"""

# A transition fenced by an agent id (ARGV[9], '' for none: the API's) changes nothing unless
# that agent holds the job's lease.
TRANSITION_LUA = """
local job, events, queue = KEYS[1], KEYS[2], KEYS[3]
local prefix, id, dst, allowed, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local kind, msg, data, fence = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local cur = redis.call('HGET', job, 'state')
if not cur then return {0, ''} end
if fence ~= '' and redis.call('HGET', job, 'lease_agent') ~= fence then return {-1, cur} end
if not string.find(',' .. allowed .. ',', ',' .. cur .. ',', 1, true) then return {0, cur} end
redis.call('HSET', job, 'state', dst, 'updated_at', now)
redis.call('HINCRBY', job, 'rev', 1)
for i = 10, #ARGV, 2 do redis.call('HSET', job, ARGV[i], ARGV[i + 1]) end
redis.call('ZREM', prefix .. ':by-state:' .. cur, id)
redis.call('ZADD', prefix .. ':by-state:' .. dst, redis.call('HGET', job, 'created_at'), id)
if dst == 'queued' then
  redis.call('ZADD', queue, redis.call('HGET', job, 'queue_score'), id)
  redis.call('HSET', job, 'queued_at', now)
else
  redis.call('ZREM', queue, id)
end
redis.call('XADD', events, '*', 'ts', now, 'kind', kind, 'message', msg, 'data', data)
return {1, cur}
"""

# Claim the one job the scheduling policy chose (policy/) if it is still queued:
# it becomes `planning` on this node and GPU, leased to the agent (ARGV[6], until ARGV[7]),
# and its wait since it was queued goes into the queue-wait histogram (KEYS[2], a hash:
# cumulative bucket counts by upper bound in ARGV[8..], `+Inf`, `count` and `sum`), so the
# count survives API restarts. Two agents can never claim one job.
CLAIM_LUA = """
local job, waits, events = KEYS[1], KEYS[2], KEYS[3]
local prefix, id, node, gpu, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if redis.call('HGET', job, 'state') ~= 'queued' then return 0 end
redis.call('ZREM', prefix .. ':queue', id)
redis.call('HSET', job, 'state', 'planning', 'node', node, 'gpu', gpu, 'updated_at', now,
           'started_at', now, 'lease_agent', ARGV[6], 'lease_expires_at', ARGV[7],
           'state_reason', '')
redis.call('HDEL', job, 'worker_pid', 'worker_start')
redis.call('HINCRBY', job, 'rev', 1)
redis.call('ZREM', prefix .. ':by-state:queued', id)
redis.call('ZADD', prefix .. ':by-state:planning', redis.call('HGET', job, 'created_at'), id)
redis.call('XADD', events, 'MAXLEN', '~', 10000, '*', 'ts', now, 'kind', 'state',
           'message', 'planning on node ' .. node, 'data', '{"state":"planning"}')
local since = redis.call('HGET', job, 'queued_at') or redis.call('HGET', job, 'created_at')
local wait = math.max(0, tonumber(now) - tonumber(since))
for i = 8, #ARGV do
  if wait <= tonumber(ARGV[i]) then redis.call('HINCRBY', waits, ARGV[i], 1) end
end
redis.call('HINCRBY', waits, '+Inf', 1)
redis.call('HINCRBY', waits, 'count', 1)
redis.call('HINCRBYFLOAT', waits, 'sum', wait)
return 1
"""

# Progress from a job's worker, written only while the writing agent holds the job's lease:
# fields (ARGV[4..] pairs after the event's kind, message and data) and one event.
REPORT_LUA = """
local job, events = KEYS[1], KEYS[2]
if redis.call('HGET', job, 'lease_agent') ~= ARGV[1] then return 0 end
local now, kind, msg, data = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
redis.call('HSET', job, 'updated_at', now)
redis.call('HINCRBY', job, 'rev', 1)
for i = 6, #ARGV, 2 do redis.call('HSET', job, ARGV[i], ARGV[i + 1]) end
if kind ~= '' then
  redis.call('XADD', events, 'MAXLEN', '~', 10000, '*', 'ts', now, 'kind', kind,
             'message', msg, 'data', data)
end
return 1
"""

# Extend this agent's leases; returns the ids whose lease another agent holds now.
RENEW_LUA = """
local lost = {}
for i, job in ipairs(KEYS) do
  if redis.call('HGET', job, 'lease_agent') == ARGV[1] then
    redis.call('HSET', job, 'lease_expires_at', ARGV[2])
  else
    table.insert(lost, ARGV[2 + i])
  end
end
return lost
"""

# A page of an index, newest first: its ids, each job's revision ('' for a job without one)
# and the index's size.
PAGE_REVS_LUA = """
local ids = redis.call('ZREVRANGE', KEYS[1], ARGV[2], ARGV[3])
local revs = {}
for i, id in ipairs(ids) do revs[i] = redis.call('HGET', ARGV[1] .. id, 'rev') or '' end
return {ids, revs, redis.call('ZCARD', KEYS[1])}
"""

# ARGV[5]: the id of a holder known to be dead (its process gone), whose record may be
# replaced before it expires; '' for none.
HOLD_NODE_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local holder = cjson.decode(cur)['agent_id']
  if holder and holder ~= '' and holder ~= ARGV[2] and holder ~= ARGV[5] then return cur end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[4])
return false
"""
