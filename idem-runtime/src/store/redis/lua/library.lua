-- The library's frame (after the constants the store writes above it, and
-- before prelude.lua, jobs.lua and the scripts).
--
-- The store's scripts are one Redis Functions library: the server runs this
-- code once, when the library loads (`FUNCTION LOAD`), and keeps the
-- functions it registers; a call (`FCALL`) runs one function only. Each
-- script is the body of one function, registered as LIBRARY .. '_' .. its
-- name (function names are global on a server: the library's versioned name
-- keeps two versions of the store apart).

-- The calling function's keys and arguments: the scripts and the shared code
-- read them as they read KEYS and ARGV under EVAL. Set on every call, before
-- anything else runs (a server runs one function at a time).
local KEYS, ARGV

local function register(name, flags, body)
  redis.register_function{
    function_name = LIBRARY .. '_' .. name,
    callback = function(keys, args)
      KEYS, ARGV = keys, args
      return body()
    end,
    flags = flags,
  }
end
