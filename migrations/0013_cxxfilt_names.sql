-- gpuprof schema, version 13: kernel names written as c++filt writes them.
--
-- The demangled form of C++ names now follows c++filt (libiberty), torch.profiler and Nsight:
-- template literals as `32u` and `4ul` (not `(unsigned int)32` and `(unsigned long)4`), and no
-- return type for a function template whose lambda appears inside a name. The forms stored by
-- an older gpuprofd are cleared here; the writer stores the new ones at start, as it does for
-- names stored before version 6.
UPDATE strings SET demangled = NULL WHERE value GLOB '_Z*';
