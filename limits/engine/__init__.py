"""The engine: a decision in process and in Redis. The send log's bytes and
Lua, the transport that runs it, the policy table the gate reads (rules, quiet hours, topics, the
control group's and the arms' assignment, reservations), time zones and calendar periods, and
the log's upkeep. Nothing here reads the database: what it decides over is handed to it."""
