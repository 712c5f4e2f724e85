-- gpuprof schema, version 4: one context row per (session, process, context) and one stream
-- row per (session, process, context, stream).
--
-- CUPTI reports a context or stream only when it is created. For those created before a trace
-- started (a late attach), the injector derives the row from the first activity on it and marks
-- what it cannot know with 4294967295 (context.null_stream, stream.flags). The writer upserts
-- on these keys: a row CUPTI reported replaces a derived one, never the other way round.
DELETE FROM context WHERE rowid NOT IN (SELECT min(rowid) FROM context GROUP BY session, proc, ctx);
CREATE UNIQUE INDEX context_key ON context(session, proc, ctx);
DELETE FROM stream WHERE rowid NOT IN (SELECT min(rowid) FROM stream GROUP BY session, proc, ctx, stream);
CREATE UNIQUE INDEX stream_key ON stream(session, proc, ctx, stream);
