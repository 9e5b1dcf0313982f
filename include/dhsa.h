/* dhsa.h: the one public header of dhsa, a C11 library for long-context LLM
 * inference on a memory budget.
 *
 * Contract, in short:
 *   - Every fallible call returns dhsa_status (0 = DHSA_OK, negative = error);
 *     dhsa_last_error() then holds a sentence for humans (thread-local).
 *     The library never exits or aborts.
 *   - A dhsa_ctx owns the thread pool, the memory arena and its statistics,
 *     and an optional memory budget. Kernels allocate only through it, and
 *     every kernel has an exact workspace query, so an over-budget call fails
 *     with DHSA_ERR_MEMORY_BUDGET before doing any work.
 *   - Tensors are strided views in logical order [batch, heads, seq, dim]
 *     (PyTorch SDPA order); strides are in elements, so a batch-first buffer
 *     [batch, seq, heads, dim] is passed without a copy.
 *   - Results do not depend on the number of threads.
 *   - Objects may be shared by threads under the rules of "Threads" (dhsa/core.h):
 *     a ctx serialises the calls made on it, a session refuses a second
 *     concurrent eval (DHSA_ERR_BUSY), read-only objects are shared freely.
 *   - A failed call leaves its objects as they were before it: a session
 *     keeps the tokens committed before a failed eval, for every attention
 *     method (dhsa_session_eval).
 *
 * The interface is cut into section headers, included here in order (each
 * also compiles alone):
 *   dhsa/core.h       status codes, threads, CPU features, the context
 *                     (threads, arena, budget), tensors, process memory
 *   dhsa/attn.h       attention, attention merge, sparse layouts, synthetic
 *                     workloads and fidelity
 *   dhsa/route.h      DHSA routing (prefill), the boundary predictor and its
 *                     training, the decode-time index
 *   dhsa/gguf.h       GGUF files (read and write)
 *   dhsa/tokenizer.h  tokenizers and chat templates
 *   dhsa/model.h      llama2.c checkpoints and the model runner
 *   dhsa/session.h    sessions: eval, memory plan, context parallelism,
 *                     saved state
 *   dhsa/sample.h     the sampler and JSON-constrained sampling
 *   dhsa/eval.h       retrieval tasks and the evaluation measurements
 *
 * Tests: make test (tests/test_*.c); see README.md.
 */
#ifndef DHSA_H
#define DHSA_H

#define DHSA_VERSION "0.1.0"

#include "dhsa/core.h"
#include "dhsa/attn.h"
#include "dhsa/route.h"
#include "dhsa/gguf.h"
#include "dhsa/tokenizer.h"
#include "dhsa/model.h"
#include "dhsa/session.h"
#include "dhsa/sample.h"
#include "dhsa/eval.h"

#endif /* DHSA_H */
