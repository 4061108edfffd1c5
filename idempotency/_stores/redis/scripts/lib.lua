-- Shared prelude of every mcp-once script (prepended by lua.py; not run on its own).
--
-- A record is ONE Redis string at KEYS[1]: a fixed binary header, the fingerprint, the token,
-- then the result bytes. One string rather than a hash keeps a completed record's overhead near
-- 200 bytes; a hash turns into a hashtable as soon as the result passes 64 bytes (~900 bytes).
--
--   >B  format (1, 2 or 3)  >B  state (1 in progress, 2 completed, 3 unknown, 4 released)
--   >i8 fence               >i8 attempts
--   >i8 created_us          >i8 updated_us
--   >i8 lease_deadline_us   >i8 completed_us       >i8 expires_us     (0 = none)
--   >H  fingerprint length, fingerprint bytes (as the client packed them: a SHA-256 hex
--       digest arrives as 0xFF + 32 raw bytes; scripts only compare them)
--   B   token length (32 or 0), token bytes
--   format 2 only: B tool name length (1..255), tool name bytes (UTF-8, for operators)
--   format 3 only: B tool name length (0..255), tool name bytes, then >I4 history length and
--       the record's history (see `record_event`: the seal line, if any, and event lines)
--   result bytes (the rest)
--
-- A COMPLETED record has no lease: its lease_deadline_us slot holds the delivery mark instead
-- (DELIVERED when its answer reached its caller, 0 when not: idempotency._stores.store.Record.
-- delivered, read only for keys the server derived). The previous release writes 0 there and
-- never reads a completed record's lease, so a record reads the same to both releases.
--
-- Format 1 is a record without a tool name (the previous release wrote only those): it is read
-- as a record whose tool is unknown, and written again as format 1 until a claim names its tool.
-- A record with a tool name is format 2, which the previous release refuses as unknown, so a
-- record never says "format 2" unless it carries a tool name.
--
-- Format 3 is a record carrying its own history (rule 24: it lives inside the record and dies
-- with it), which releases before it refuse as unknown. A store that keeps histories writes it;
-- one that keeps none (`history=False`) or is pinned to format 2 (`record_format=2`, for a
-- rolling upgrade) writes formats 1 and 2 as before, and keeps a format-3 record's history as it
-- found it. A format-1 or -2 record may have a history beside it, KEYS[1] .. ':h' (the release
-- of issue 37 wrote one): read while the record is (history.lua), and moved inside the record
-- the first time an event is recorded for it here.
--
-- All times are microseconds of the Redis clock (TIME) plus ARGV[1], a test-only offset.
-- expires_us decides liveness; the key's PEXPIRE is only garbage collection, never earlier.
--
-- IN_PROGRESS and UNKNOWN records never expire (rule 25: an in-doubt record is never forgotten
-- unseen) and have no PEXPIRE. An UNKNOWN record stores expires_us 0; an IN_PROGRESS one stores
-- NEVER, because the previous release refuses an IN_PROGRESS record without an expiry (and
-- reads NEVER as a deadline it never reaches). This release reads any IN_PROGRESS expiry as 0.
--
-- A key's fence never repeats (rule 25): a record saved with an expiry leaves its fence in a
-- memo beside it, KEYS[1] .. ':f' (the same hash tag, so the same slot; pcall, as the history),
-- "FENCE:EXPIRES_US", which a claim of the key after the record expired numbers its new
-- execution above, for FENCE_MEMORY past the record's expiry (`remembered_fence`).
--
-- In-doubt index: the set ARGV[#ARGV - 3] (audited scripts; '' on a Redis Cluster, where one
-- set could not share every record's slot) holds the key of every IN_PROGRESS or UNKNOWN record,
-- changed by `save` in the transition's own script, so that listing them reads only them
-- (`RedisKeyStore.list_records`). Its member '' marks it complete (built by a scan of every
-- record the first time it is read: records written before it, or by the previous release,
-- are found that way; `purge` adds any it meets too).

local FORMAT, FORMAT_WITH_TOOL, FORMAT_HISTORY = 1, 2, 3
local IN_PROGRESS, COMPLETED, UNKNOWN, RELEASED = 1, 2, 3, 4
local HEAD = '>BBi8i8i8i8i8i8i8'
local HEAD_BYTES = 58
local DELIVERED = 1
local TOKEN_BYTES = 32
-- The expiry an IN_PROGRESS record stores (year 2286; idempotency._stores.store.NEVER_EXPIRES).
local NEVER = 1e16
-- How long a record's fence is remembered after it expired (idempotency._stores.store.
-- FENCE_MEMORY: a day).
local FENCE_MEMORY_US = 86400000000
-- A logically expired record stays physically at least this long, so purge can still count it.
local MIN_TTL_MS = 1000

local function clock()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
end

local function int(n)
    return string.format('%d', n)
end

-- Each format's whole layout up to the result, for one struct.unpack (`c0`: as many bytes as the
-- number before it says) and one struct.pack (`c0`: the whole string): a record is read and
-- written with one call each instead of one per field, which is most of a script's work.
local LAYOUT = {
    [FORMAT] = HEAD .. 'Hc0Bc0',
    [FORMAT_WITH_TOOL] = HEAD .. 'Hc0Bc0Bc0',
    [FORMAT_HISTORY] = HEAD .. 'Hc0Bc0Bc0I4c0',
}

-- The fields of a record that reads whole with its format's LAYOUT, checked as `checked` checks
-- them (nil, why), or nil (nil reason) when the bytes do not: `checked` then names the flaw.
local function checked(rec, st, fence, att, cr, up, ls, cp, ex, tlen)
    if st < IN_PROGRESS or st > RELEASED then
        return nil, 'unknown state ' .. int(st)
    end
    if fence < 1 or att < 1 or cr <= 0 or up <= 0 then
        return nil, 'fence, attempts or timestamps out of range'
    end
    if (st == IN_PROGRESS) ~= (tlen == TOKEN_BYTES) or (st ~= IN_PROGRESS and tlen ~= 0) then
        return nil, 'token does not match the state'
    end
    if (st == UNKNOWN and ex ~= 0) or ((st == COMPLETED or st == RELEASED) and ex == 0) then
        return nil, 'expiry does not match the state'
    end
    if st == IN_PROGRESS then
        rec.expires = 0 -- kept until it ends, whatever expiry it was stored with
    end
    rec.saved_state = st
    if (st == IN_PROGRESS and ls <= 0) or (st == COMPLETED and cp <= 0) then
        return nil, 'deadline missing for the state'
    end
    if st ~= COMPLETED and #rec.result ~= 0 then
        return nil, 'result stored in a record that is not completed'
    end
    return rec
end

-- Listings read records without a script: idempotency/_stores/redis/record.py decodes this same
-- layout in Python, refusing what this refuses with the same words (a test reads both ways).
-- The field-by-field reading (`decode_fields`) is only for bytes the one-call reading refuses,
-- to name what is wrong with them.
local function decode_fields(raw)
    if #raw < HEAD_BYTES + 3 then
        return nil, 'shorter than a record header'
    end
    local ok, v, st, fence, att, cr, up, ls, cp, ex, pos = pcall(struct.unpack, HEAD, raw)
    if not ok then
        return nil, 'unreadable header'
    end
    if v ~= FORMAT and v ~= FORMAT_WITH_TOOL and v ~= FORMAT_HISTORY then
        return nil, 'unknown record format ' .. int(v)
    end
    local fplen = struct.unpack('>H', raw, pos)
    pos = pos + 2
    if pos + fplen > #raw then
        return nil, 'truncated fingerprint'
    end
    local fp = string.sub(raw, pos, pos + fplen - 1)
    pos = pos + fplen
    local tlen = string.byte(raw, pos)
    pos = pos + 1
    if pos + tlen - 1 > #raw then
        return nil, 'truncated token'
    end
    local token = string.sub(raw, pos, pos + tlen - 1)
    pos = pos + tlen
    local tool, hist = '', nil
    if v ~= FORMAT then
        local nlen = string.byte(raw, pos)
        if nlen == nil or (nlen == 0 and v == FORMAT_WITH_TOOL) or pos + nlen > #raw then
            return nil, 'truncated tool name'
        end
        tool = string.sub(raw, pos + 1, pos + nlen)
        pos = pos + 1 + nlen
    end
    if v == FORMAT_HISTORY then
        if pos + 3 > #raw then
            return nil, 'truncated history'
        end
        local hlen = struct.unpack('>I4', raw, pos)
        pos = pos + 4
        if pos + hlen - 1 > #raw then
            return nil, 'truncated history'
        end
        hist = string.sub(raw, pos, pos + hlen - 1)
        pos = pos + hlen
    end
    local rec = {
        state = st, fence = fence, attempts = att, created = cr, updated = up, lease = ls,
        completed = cp, expires = ex, fp = fp, token = token, tool = tool,
        result = string.sub(raw, pos), format = v, hist = hist,
    }
    return checked(rec, st, fence, att, cr, up, ls, cp, ex, tlen)
end

local function decode(raw)
    local layout = LAYOUT[string.byte(raw, 1)]
    if layout == nil or #raw < HEAD_BYTES + 3 then
        return decode_fields(raw)
    end
    local ok, v, st, fence, att, cr, up, ls, cp, ex, fp, token, a, b, c = pcall(struct.unpack,
        layout, raw)
    if not ok then
        return decode_fields(raw)
    end
    -- after the token: format 1 the position; 2 the tool, the position; 3 the tool, the history,
    -- the position
    local tool, hist, pos = '', nil, a
    if v == FORMAT_WITH_TOOL then
        if #a == 0 then
            return nil, 'truncated tool name'
        end
        tool, pos = a, b
    elseif v == FORMAT_HISTORY then
        tool, hist, pos = a, b, c
    end
    local rec = {
        state = st, fence = fence, attempts = att, created = cr, updated = up, lease = ls,
        completed = cp, expires = ex, fp = fp, token = token, tool = tool,
        result = string.sub(raw, pos), format = v, hist = hist,
    }
    return checked(rec, st, fence, att, cr, up, ls, cp, ex, #token)
end

-- The stored record, nil when there is none, or nil plus why it cannot be read as ours.
local function load(key)
    local raw = redis.pcall('GET', key)
    if raw == false then
        return nil
    end
    if type(raw) == 'table' then
        return nil, 'the key holds another Redis type (' .. tostring(raw.err) .. ')'
    end
    return decode(raw)
end

-- The record's bytes: format 3 when it carries a history (r.hist), else 1 or 2.
local function encode(r)
    local expires = r.expires
    if r.state == IN_PROGRESS then
        expires = NEVER
    end
    local fp, token, tool, hist = r.fp, r.token, r.tool, r.hist
    if hist ~= nil then
        return struct.pack(LAYOUT[FORMAT_HISTORY], FORMAT_HISTORY, r.state, r.fence, r.attempts,
            r.created, r.updated, r.lease, r.completed, expires, #fp, fp, #token, token, #tool,
            tool, #hist, hist) .. r.result
    elseif #tool > 0 then
        return struct.pack(LAYOUT[FORMAT_WITH_TOOL], FORMAT_WITH_TOOL, r.state, r.fence,
            r.attempts, r.created, r.updated, r.lease, r.completed, expires, #fp, fp, #token,
            token, #tool, tool) .. r.result
    end
    return struct.pack(LAYOUT[FORMAT], FORMAT, r.state, r.fence, r.attempts, r.created,
        r.updated, r.lease, r.completed, expires, #fp, fp, #token, token) .. r.result
end

-- Whether a record in `state` is in doubt, or may turn so: IN_PROGRESS or UNKNOWN.
local function open(state)
    return state == IN_PROGRESS or state == UNKNOWN
end

-- Keep the in-doubt index in step with the record `r` at `key` about to be saved, when its state
-- changes (which only audited scripts do: their trailer carries the index's key; a renewal or a
-- delivery mark changes no state): in it while in doubt, out of it once not. Adding on every
-- change within doubt too (a record the previous release claimed, turned UNKNOWN here) keeps a
-- record written without the index from staying out of it. Before the record is written: a
-- failure changes nothing.
local function index(key, r)
    local before = r.saved_state
    if r.state == before then
        return
    end
    r.saved_state = r.state
    local set = ARGV[#ARGV - 3]
    if set == '' then
        return
    end
    if open(r.state) then
        redis.call('SADD', set, key)
    elseif open(before) then
        redis.call('SREM', set, key)
    end
end

-- A record written before histories moved inside it whose history has now moved in (see
-- `record_event`): the key that held it goes.
local function moved(key, r)
    if r.moved then
        r.moved = false
        redis.pcall('UNLINK', key .. ':h')
    end
end

local function save(key, r, now)
    index(key, r)
    moved(key, r)
    local raw = encode(r)
    if r.expires == 0 then
        redis.call('SET', key, raw)
        return
    end
    local ttl = math.max(math.ceil((r.expires - now) / 1000), MIN_TTL_MS)
    redis.call('SET', key, raw, 'PX', int(ttl))
    local forget = r.expires + FENCE_MEMORY_US
    redis.pcall('SET', key .. ':f', int(r.fence) .. ':' .. int(r.expires), 'PX',
        int(math.max(math.ceil((forget - now) / 1000), MIN_TTL_MS)))
end

-- The last fence of the record at `key` that expired (`stored`: it, if still stored), while it
-- is remembered: FENCE_MEMORY past the record's expiry (0: none). Mirrors idempotency._stores.
-- transitions.remembered.
local function remembered_fence(key, stored, now)
    local fence = 0
    if stored ~= nil and stored.expires ~= 0 and stored.expires + FENCE_MEMORY_US > now then
        fence = stored.fence
    end
    local memo = redis.pcall('GET', key .. ':f')
    if type(memo) ~= 'string' then
        return fence
    end
    local kept, expired = string.match(memo, '^(%d+):(%d+)$')
    if kept ~= nil and tonumber(expired) + FENCE_MEMORY_US > now then
        fence = math.max(fence, tonumber(kept))
    end
    return fence
end

local function live(r, now)
    if r ~= nil and r.expires ~= 0 and r.expires <= now then
        return nil
    end
    return r
end

-- The record as read.lua replies it:
--   {'record', now, state, fence, attempts, created, updated, lease, completed, expires,
--    fingerprint, token, result, tool ('' when the record names none)}
local function fields(r, now)
    return {'record', now, r.state, r.fence, r.attempts, r.created, r.updated, r.lease,
        r.completed, r.expires, r.fp, r.token, r.result, r.tool}
end

-- The record while `token` holds its claim (even past the lease, as long as no one took over).
local function held(r, token, now)
    r = live(r, now)
    if r == nil or r.state ~= IN_PROGRESS or r.token ~= token then
        return nil
    end
    return r
end

-- The compare-and-set every transition after claim starts with: the record at `key` if `token`
-- still holds it, else the reply the script must give ({'corrupt', why} or {'lost'}).
-- `resent` (a write sent again after its first reply was lost) with `mine`: a record for which
-- mine(found) holds (found may be nil) is the write's own effect, already applied; the reply is
-- then {'ok'}, and the record is saved again unchanged, so that a WAIT after it covers it.
local function load_held(key, token, now, resent, mine)
    local stored, why = load(key)
    if why then
        return nil, {'corrupt', why}
    end
    local r = held(stored, token, now)
    if r ~= nil then
        return r, nil
    end
    local found = live(stored, now)
    if resent and mine(found) then
        if found ~= nil then
            save(key, found, now)
        end
        return nil, {'ok'}
    end
    return nil, {'lost'}
end

-- The live record at `key` (nil: none, or expired), or a {'corrupt', why} reply to return.
local function load_live(key, now)
    local stored, why = load(key)
    if why then
        return nil, {'corrupt', why}
    end
    return live(stored, now), nil
end

-- The record `r` in doubt: UNKNOWN, held by no one, kept until someone resolves it (rule 9);
-- `events(r)` records its events before it is saved.
local function to_unknown(key, r, now, events)
    r.state = UNKNOWN
    r.token = ''
    r.updated = now
    r.expires = 0
    events(r)
    save(key, r, now)
end

local function tombstone(r, now, retention)
    r.state = RELEASED
    r.token = ''
    r.result = ''
    r.updated = now
    r.lease = 0
    r.expires = now + retention
    return r
end

-- Waiters subscribe to the record's own key name; the payload is the new state.
local function announce(key, r)
    redis.call('PUBLISH', key, r.state)
end

-- History and audit stream (rules 20 and 24; idempotency._stores.history is the reference: the
-- same line format, chaining, counting, bounds and seal, read back by one parser in Python).
-- A record's history is inside the record (format 3: r.hist), so it is written by the same SET
-- as the record, lives exactly as long as the record and goes with it: no second key, no grace
-- after expiry. `record_event` adds an event to r.hist, and the caller saves the record after
-- it (`save`, or `keep` for a replay or refusal that changes nothing else). Scripts that record
-- events get three more arguments at the end: ARGV[#ARGV - 2], what the caller said (DETAILS,
-- already encoded: a scope digest, why released, who settled); ARGV[#ARGV - 1], the audit
-- stream's key: '' when the store keeps no history (or writes format 2), '-' when it keeps no
-- stream (the default, and always on a Redis Cluster, where a stream shared by a slot's records
-- would be a key no script declares, split from them by a migration: the histories are the
-- audit trail), else the stream (`audit_stream=true`), to which the same script appends each
-- event; and ARGV[#ARGV], '' or, with an audit key, this record's history key as HMAC-SHA1's
-- two padded blocks (64 bytes each) and the audit key's id (idempotency._stores.audit_key):
-- never the audit key itself, and never stored. Before these three, ARGV[#ARGV - 3]: the
-- in-doubt index's key (see `index`).
local HISTORY_MAX = 32
local AUDIT_MAX = '100000' -- a string: XADD takes it as is
local DIGEST_CHARS = 16
-- Histories shorter than this take `append_fast` (at most some 22 lines: below HISTORY_MAX).
local FAST_BYTES = 1024

local function said()
    return ARGV[#ARGV - 2]
end

local function history_lines(text)
    local lines = {}
    for line in string.gmatch(text, '[^\n]+') do
        lines[#lines + 1] = line
    end
    return lines
end

-- (anchor or nil, at, code, fence, info, digest) of a history line.
local function split_line(line)
    local anchor
    if string.sub(line, 1, 1) == '^' then
        anchor = string.sub(line, 2, 1 + DIGEST_CHARS)
        line = string.sub(line, 3 + DIGEST_CHARS)
    end
    local at, code, fence, info, digest = string.match(line, '^(%d+)|(%a)|(%d+)|%d+|([^|]*)|(%x+)$')
    return anchor, at, code, fence, info, digest
end

-- The digest an event carries: SHA-1 over its predecessor's digest and its body, or with an
-- audit key the record's HMAC of the same.
local function chained(keyed, prev, body)
    if keyed ~= nil then
        return keyed.mac(prev .. '|' .. body)
    end
    return string.sub(redis.sha1hex(prev .. '|' .. body), 1, DIGEST_CHARS)
end

-- `text` (event lines) with its seal: without an audit key, the seal found, unchanged; with
-- one, the count and adopted lines carried over from its own seal (never recounted, so lines
-- cut out stay missing; else every line of `old`, the lines before this event, adopted), moved
-- on by this event (`grew`: a line added, else one replaced; `dropped`: lines dropped from the
-- front), and MACed.
local function sealed(keyed, seal, old, text, grew, dropped)
    if keyed == nil then
        return seal and (seal .. '\n' .. text) or text
    end
    local id, count, adopted
    if seal ~= nil then
        id, count, adopted = string.match(seal, '^#(%x+)|(%d+)|(%d+)|%x+|%x+$')
    end
    if id == keyed.id then
        count, adopted = tonumber(count), tonumber(adopted)
    elseif old == '' then
        count, adopted = 0, 0
    else
        local _, breaks = string.gsub(old, '\n', '')
        count, adopted = breaks + 1, breaks + 1
    end
    if grew then
        count = count + 1
    elseif adopted == count then -- the replaced line was adopted; its successor is keyed
        adopted = adopted - 1
    end
    count = math.max(0, count - dropped)
    adopted = math.min(count, math.max(0, adopted - dropped))
    local fields = keyed.id .. '|' .. int(count) .. '|' .. int(adopted) .. '|'
        .. string.sub(text, -DIGEST_CHARS)
    return '#' .. fields .. '|' .. keyed.mac('seal|' .. fields) .. '\n' .. text
end

-- An event's line up to its digest, AT|KIND|FENCE|ATTEMPT|DETAILS, in one format call: the hot
-- path's cost is mostly calls like it (`at`: milliseconds, a number or its digits).
local function event_body(at, code, r, info)
    return string.format('%d|%s|%d|%d|%s', at, code, r.fence, r.attempts, info)
end

-- When the newest line of `text` was written, if it is a claimed event (nil otherwise): the
-- completion's duration in the common case, found without splitting the history into lines.
local function claimed_last(text)
    local from, found = 1, 0
    while true do
        local at = string.find(text, '\n', from, true)
        if at == nil then
            break
        end
        found, from = at, at + 1
    end
    if string.byte(text, found + 1) == 94 then -- '^': an anchored line, PREV| first
        found = found + 2 + DIGEST_CHARS
    end
    local at = string.match(text, '^(%d+)|C|', found + 1)
    return at and tonumber(at)
end

-- The common case, without splitting the history into lines: an event that is not counted, on a
-- history short enough that it needs no trimming, chains to the last 16 characters (the last
-- digest). A completion takes its claim's time from the last line; nil (another last line):
-- use `append_full`. The event lines after it, then the line (nil when the history had lines
-- before it: the line is then its last `size` bytes), then `size`.
local function append_fast(text, r, code, info, now, keyed)
    local at = math.floor(now / 1000)
    local body
    if code == 'D' then
        local claimed = claimed_last(text)
        if claimed == nil then
            return nil
        end
        body = string.format('%d|D|%d|%d|%s,d=%d', at, r.fence, r.attempts, info, at - claimed)
    else
        body = event_body(at, code, r, info)
    end
    local digest = chained(keyed, string.sub(text, -DIGEST_CHARS), body)
    if #text == 0 then
        local line = body .. '|' .. digest
        return line, line
    end
    -- one string for the history, not the line and then the history: the line is cut from it
    -- only for the audit stream (`record_event`)
    return text .. '\n' .. body .. '|' .. digest, nil, #body + #digest + 1
end

-- Any event, splitting the history into lines: counted ones replace a last line they repeat,
-- and a history past HISTORY_MAX lines drops its oldest (anchoring the first kept). The event
-- lines after it, the line, whether it was added (not a replacement), how many were dropped.
local function append_full(text, r, code, info, now, counted, keyed)
    local lines = history_lines(text)
    local at = int(math.floor(now / 1000))
    local prev, anchored, grew = '', false, true
    local last = lines[#lines]
    if last then
        local anchor, lat, lcode, lfence, linfo, ldigest = split_line(last)
        local base = string.gsub(string.gsub(linfo or '', ',?n=%d+', ''), ',?l=%d+', '')
        if counted and lcode == code and tonumber(lfence) == r.fence and base == info then
            local count = tonumber(string.match(linfo, 'n=(%d+)') or '1') + 1
            info = (info ~= '' and (info .. ',') or '') .. 'n=' .. int(count) .. ',l=' .. at
            at = lat
            grew = false
            lines[#lines] = nil
            if anchor then
                prev, anchored = anchor, true
            elseif #lines > 0 then
                local _, _, _, _, _, d = split_line(lines[#lines])
                prev = d
            end
        else
            prev = ldigest
        end
    end
    if code == 'D' then
        for i = #lines, 1, -1 do
            local _, cat, ccode = split_line(lines[i])
            if ccode == 'C' then
                info = info .. ',d=' .. int(tonumber(at) - tonumber(cat))
                break
            end
        end
    end
    local body = event_body(at, code, r, info)
    local line = body .. '|' .. chained(keyed, prev, body)
    if anchored then
        line = '^' .. prev .. '|' .. line
    end
    lines[#lines + 1] = line
    local dropped = math.max(0, #lines - HISTORY_MAX)
    if dropped > 0 then
        local _, _, _, _, _, before = split_line(lines[dropped])
        local kept = {}
        for i = dropped + 1, #lines do
            kept[#kept + 1] = lines[i]
        end
        if string.sub(kept[1], 1, 1) ~= '^' then
            kept[1] = '^' .. before .. '|' .. kept[1]
        end
        lines = kept
    end
    return table.concat(lines, '\n'), lines[#lines], grew, dropped
end

-- Add one event of the record `r` at `key` (kind `code`, DETAILS `info`) to its history (r.hist,
-- saved with the record by the caller) and to the audit stream, if kept. `counted`: a replay or
-- refusal, which replaces a last line it repeats.
local function record_event(key, r, code, info, now, counted)
    local audit = ARGV[#ARGV - 1]
    if audit == '' then
        return
    end
    -- The record's history key from the last argument, or nil (no audit key: plain digests):
    -- its id, and `mac`, HMAC-SHA1 of a text under it as Python's hmac.new(key, text, sha1)
    -- (the first DIGEST_CHARS hex digits). Made here, not as a function of the prelude (each
    -- of which is made again on every call), so that a store without a key pays nothing for it.
    local keyed, given = nil, ARGV[#ARGV]
    if given ~= '' then
        local sub, sha = string.sub, redis.sha1hex
        local ipad, opad = sub(given, 1, 64), sub(given, 65, 128)
        keyed = {id = sub(given, 129), mac = function(text)
            local h = sha(ipad .. text)
            -- The inner digest's 20 bytes, as five 32-bit numbers (the cheapest way measured).
            local inner = struct.pack('>I4I4I4I4I4', tonumber(sub(h, 1, 8), 16),
                tonumber(sub(h, 9, 16), 16), tonumber(sub(h, 17, 24), 16),
                tonumber(sub(h, 25, 32), 16), tonumber(sub(h, 33, 40), 16))
            return sub(sha(opad .. inner), 1, DIGEST_CHARS)
        end}
    end
    local stored = r.hist
    if stored == nil then
        stored = ''
        if r.format ~= nil and r.format ~= FORMAT_HISTORY then
            -- written before histories moved inside records: its history, if any, moves in
            -- (pcall: in a slot migration's moment the pair may be split; it starts anew then)
            local kept = redis.pcall('GET', key .. ':h')
            if type(kept) == 'string' then
                stored = kept
            end
            r.moved = true
        end
    end
    local seal, text = nil, stored
    if string.byte(text, 1) == 35 then -- '#': the seal line, then the event lines
        local at = string.find(text, '\n', 1, true) or #text + 1
        seal, text = string.sub(text, 1, at - 1), string.sub(text, at + 1)
    end
    local new, line, grew, dropped, size
    if not counted and #text < FAST_BYTES then
        new, line, size = append_fast(text, r, code, info, now, keyed)
        grew, dropped = true, 0
    end
    if not new then -- a completion whose last line is not its claim
        new, line, grew, dropped = append_full(text, r, code, info, now, counted, keyed)
    end
    if keyed == nil and seal == nil then
        r.hist = new
    else
        r.hist = sealed(keyed, seal, text, new, grew, dropped)
    end
    if audit ~= '-' then
        line = line or string.sub(new, -size)
        -- One field (fewer for XADD to encode): the line, then the tool's name after its length
        -- (one byte: at most 255) and the record's key (idempotency._stores.redis.history).
        local tag = string.sub(key, string.find(key, '{', 1, true) + 1, -2)
        redis.call('XADD', audit, 'MAXLEN', '~', AUDIT_MAX, '*',
            'a', line .. '\n' .. string.char(#r.tool) .. r.tool .. tag)
    end
end

-- Save the record `r` at `key` after a replay's or refusal's event, which changed nothing but its
-- history: its time to live and its place in the in-doubt index stay as they are.
local function keep(key, r)
    if ARGV[#ARGV - 1] == '' then
        return -- no event was recorded
    end
    moved(key, r)
    redis.call('SET', key, encode(r), 'KEEPTTL')
end

-- Hand the record `r` to the holder `token`: the fence and attempts one higher, a new lease,
-- saved with its claimed event (said(): the claimer's scope digest, and why). A claim's takeover
-- of an expired lease (claim.lua) and a reconciliation's claim of an UNKNOWN record
-- (reconcile.lua).
local function hand_over(key, r, token, lease, now)
    r.state = IN_PROGRESS
    r.token = token
    r.fence = r.fence + 1
    r.attempts = r.attempts + 1
    r.updated = now
    r.lease = now + lease
    r.expires = 0
    record_event(key, r, 'C', said(), now, false)
    save(key, r, now)
end
