-- gpuprof schema, version 6: the demangled form of interned names.
--
-- Kernel and device-function names arrive as CUPTI reports them, mangled
-- (`_Z10add_kernelPfS_i`). The writer stores the demangled form beside them when the value is
-- a mangled C++ (Itanium) or Rust symbol, NULL otherwise (and for rows of older databases until
-- the writer fills them in at start). Queries show the demangled form and match name filters
-- against either.
ALTER TABLE strings ADD COLUMN demangled TEXT;
