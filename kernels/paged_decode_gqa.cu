// Group-aware paged decode attention on the "hnd" cache layout (family: gqa_decode + gqa_merge).
//
// One CTA owns one (sequence, KV head, partition of the sequence) and ALL the GROUP query heads
// that read that KV head, so every K/V byte is read from HBM once (a per-query-head kernel reads it
// GROUP times).
//
//   gqa_decode<T, KV, HEAD_DIM, BLOCK_SIZE, GROUP, PF_MODE, PF_K, PF_V, PF_DIST, PF_EVICT_LAST,
//              WARPS>
//     T           __half or __nv_bfloat16: q, out, and the mmas' inputs (fp16 for an fp8 cache);
//                 softmax and accumulation in fp32.
//     KV          the caches' element: T, or kvlab::fp8_e4m3 (with T either; see "fp8" below).
//     HEAD_DIM    64, 80, 96, 112, 128, 256.
//     BLOCK_SIZE  tokens per cache block, a power of two in [8, 256].
//     GROUP       num_qo_heads / num_kv_heads, 1..8.
//     PF_MODE     kvlab::PF_NONE (baseline: the prefetch code is compiled out), PF_BULK, PF_LINE.
//     PF_K, PF_V  which of the two caches to prefetch into L2.
//     PF_DIST     prefetch distance in main-loop iterations (tiles of 16 x WARPS tokens), >= 1.
//     PF_EVICT_LAST  tag prefetched lines evict-last (one createpolicy per thread at kernel start).
//     WARPS       4, or 8 where Smem's stages for 8 fit an SM (not head_dim 256); see v12.
//   gqa_merge<T, HEAD_DIM>: combines the partitions of a split-KV launch by their log-sum-exp.
//
// Launch contract (the Python wrapper's side):
//   gqa_decode: grid (max_num_partitions, num_kv_heads, num_seqs), block 32 * WARPS threads;
//     or, with a work list (mixed lengths: the wrapper lists only the partitions that hold
//     tokens, longest first or, in one wave, paired long and short (geometry.one_wave_order),
//     instead of max_num_partitions per sequence, most of them empty),
//     grid (num_items * num_kv_heads, 1, 1) and CTA x takes KV head x % num_kv_heads of
//     (sequence, partition) = work[x / num_kv_heads]: the KV heads of an item are launched
//     together, so the whole launch runs longest first (see v10).
//     Every sequence's partition 0 must be listed (an empty sequence still writes its zeros).
//     dynamic shared memory = Smem<HEAD_DIM, sizeof(KV), WARPS>::BYTES
//                           = STAGES * WARPS * 2 * WARP_TOKENS * ROW_BYTES, at 4 warps:
//       fp16/bf16 (3 stages, rows of 128 to 512 bytes): head_dim 64: 49,152  80: 61,440
//         96: 86,016  112: 86,016  128: 98,304  256: 196,608;
//       fp8 (5 stages, rows of 96 to 288 bytes): 64: 61,440  80: 61,440  96: 61,440
//         112: 102,400  128: 102,400  256: 184,320;
//       twice those at 8 warps.
//     All are above 48 KB: the wrapper must set cudaFuncAttributeMaxDynamicSharedMemorySize
//     (CuPy: kernel.max_dynamic_shared_size_bytes = bytes) before the first launch.
//     k_scale, v_scale: float [num_kv_heads] for an fp8 cache (value = stored * scale), else
//     null.
//     partition_size: a multiple of 256 (16 * WARPS suffices). When max_num_partitions == 1 the one
//     partition is the whole sequence whatever partition_size says. A CTA whose sequence has one
//     partition (max_num_partitions == 1, or seq_len <= partition_size) writes `out`; the others
//     write partial_out (fp32, normalised by its own sum) and partial_lse (natural log,
//     scaled-logit domain), and gqa_merge writes `out` of their sequences (and leaves the others).
//   gqa_merge: grid (num_qo_heads, num_merged), block 128 threads, no dynamic shared memory.
//     seqs: int32 [num_merged], the sequences to merge (the work list's split ones), or null for
//     all num_seqs in order (num_merged = num_seqs).
//     Launched as a programmatic dependent of gqa_decode (sm_90: every decode CTA signals
//     griddepcontrol.launch_dependents at its start, the merge's griddepcontrol.wait returns once
//     the decode grid has finished and its writes are visible), so the merge's launch overlaps
//     the decode's tail. Launched plainly, both instructions do nothing. It reads the partials
//     with ld.global.cg after the wait (see gqa_merge).
//   Built with KVLAB_TIMELINE defined, both stamp each CTA's start, stages and end for
//   `bench timeline` (timeline.cuh); otherwise the stamps compile to nothing.
//
// Design (WARPS = 4 or 8 warps per CTA; each warp runs its own cp.async pipeline, no CTA barrier
// in the loop):
//   - The partition is walked in tiles of 16 * WARPS tokens; warp w owns rows [16w, 16w + 16) of
//     every tile. A warp's rows start at a multiple of 16 (partition starts are multiples of
//     256), so they lie in one block when BLOCK_SIZE >= 16 and in two consecutive blocks when
//     BLOCK_SIZE == 8.
//   - Each warp copies its 16 K rows and 16 V rows into its own shared-memory stage with 16-byte
//     cp.async.cg (3 stages: 2 tiles in flight while one is computed). Rows at or past seq_len
//     are zero-filled (src-size 0: nothing is read), so garbage/NaN there never reaches the math.
//   - Scores and the PV product run on tensor cores (mma.sync m16n8k16, fp32 accumulate):
//       S[head, token] = Q[16 (GROUP used) x D] . K^T[D x 8 tokens]   (A = Q from registers)
//       O^T[dim, head] += V^T[16 dims x 16 tokens] . P^T[16 tokens x 8 heads]
//     The S accumulator fragments of two 8-token n-tiles are exactly the B fragment of P^T, so P
//     never leaves registers. Online softmax in fp32 (log2 domain): running max m and partial sums
//     l per head, the O^T accumulator rescaled by exp2(m_old - m_new) only when a head's max
//     grows by more than 2^8 (v11), so p <= 256. P is rounded to T for the
//     PV mma (the usual flash-attention trade: ~1e-4 rel. error fp16, ~1e-3 bf16). Rows 8..15 of
//     the QK mma (and heads GROUP..7) are padding: tensor-core time is far from the bottleneck.
//   - 16-bit shared-memory rows that fill whole 128-byte lines (head_dim 128: 256 bytes) are
//     stored unpadded, their 16-byte chunks swizzled by the row (see Smem): each 32-byte sector of
//     the cache lands in one sector of shared memory, so L2 serves it once (see v7), and an
//     ldmatrix phase (8 rows x 16 bytes) meets no bank conflict. Other rows, fp8's among them,
//     are padded to an odd multiple of 32 bytes: sectors land whole, at the cost of a 2-way
//     bank conflict.
//   - At the end the warps' (m, l, O) are merged through shared memory (aliasing the stages).
//
// fp8 (KV = fp8_e4m3, e4m3 with one float scale per KV head): the same pipeline on rows of half
// the bytes, with 5 stages instead of 3 (4 tiles in flight: as many bytes as fp16's 2). Values
// are widened to fp16 in registers (cvt.rn.f16x2.e4m3x2, exact: every e4m3 value is an fp16
// value) and both mmas run in fp16 whatever T is; the K scale folds into the softmax scale and
// the V scale multiplies the output once. A bf16 q is converted to fp16 once, when the CTA loads
// it: each query head is first multiplied by the power of two 2^-s that puts its largest |entry|
// in [2^14, 2^15), and 2^s joins that head's softmax scale. That conversion is exact (bf16's 8
// significant bits fit fp16's 11) for every entry within 2^28 of its head's largest; smaller ones
// become fp16 subnormals or zero, each moved by at most 2^-39 of its head's largest entry.
// The ldmatrix tiles are read as b16 pairs of fp8 values, so a lane holds other dims than the fp16
// path's: for K, 4 consecutive dims 4(lane%4)..+3 of a token, whose two halves serve as the
// fragment's k and k + 8 (Q's fragment takes the same dims, so the dot product is unchanged); for
// V (ldmatrix .trans), dims 2(lane/4) and 2(lane/4) + 1 of two tokens, which become output rows
// lane/4 and lane/4 + 8 (the dims are mapped back when the warps merge). One ldmatrix.x4 covers
// 32 dims; for head_dim 80 and 112 the last one reads 16 bytes of the row's padding, never used.
//
// Prefetch (arXiv 2504.06319, Algorithm 1, adapted): when a warp issues the cp.async of tile L it
// also prefetches into L2 its part of tile L + PF_DIST (if that tile exists in the partition), i.e.
// PF_DIST iterations ahead of the shared-memory load, PF_DIST + STAGES - 1 ahead of the math.
// One prefetch_tile_l2 call per contiguous (block, kv head) run of the tile: runs are
// min(BLOCK_SIZE, 16 * WARPS) tokens, clipped to seq_len, issued by the warp whose rows start the
// run (block 8: 2 calls per warp; 16: 1 per warp; 32: every other warp; 64: warps 0 and, with 8
// warps, 4; >= 128: warp 0), per cache.
//
// Versions tried (H200, fp16, head_dim 128). What is recorded is in
// benchmarks/results/h200/attention*.json and summed up in benchmarks/README.md; the rest are
// observations made while developing, not recorded (marked so):
//   v1  tensor-core GQA decode, 64-token tiles, 3-stage per-warp cp.async pipeline, split-KV +
//       merge, optional L2 prefetch. Split by a makespan model of CTA waves (kvlab/kernels/gqa.py):
//       filling one wave matters (observed: llama3-8b, 16 x 32k, 2 partitions 93.5% of the copy
//       roofline, 3 partitions 87.3%).
//   v2  cp.async with .L2::128B, merge kernel reading float4 rows of several
//       partitions at once. Observed, not recorded: .L2::128B gained 2.5-3% from 256k tokens
//       (.L2::64B, .L2::256B and copying all K rows before the V rows: no change); Nsight Compute
//       (llama3-8b, 64 x 8k, before .L2::128B) put this kernel and SDPA's at the same occupancy,
//       with DRAM efficiency 85% of peak here against 92% there; the merge launch took 4.6-5.9 us
//       of 30-45 us batch-1 calls. Recorded: GB/s and % of the roofline at every point, against
//       SDPA timed in the same loop, and L2 prefetch against none (it keeps enough bytes in
//       flight already: prefetch does not pay).
//   v3  fp8 caches; mixed lengths split by their work and launched as a work list.
//       Tried and dropped (observed, not recorded): the merge inside the decode launch, by the
//       last CTA of each (sequence, KV head) to arrive on a counter, merging its GROUP heads one
//       after another. It saves the second launch but serialises the merge on one CTA per KV
//       head: qwen2.5-7b 1 x 32k took 40.2 us against 30.8 us with gqa_merge, qwen2.5-14b
//       48.5 against 43.7 us (H200, separate runs). A fused merge needs the heads merged in
//       parallel (a warp each, or the partitions split across the CTA).
//   v4  the merge as a programmatic dependent launch (above): 1-2 us less a split call (observed,
//       qwen2.5-7b 1 x 32k 31.8 -> 29.5 us, 16 x 1k 21.7 -> 19.8 us; recorded in attention.json).
//       Tried and dropped (observed, not recorded): Hopper bulk copies (cp.async.bulk, one per
//       K/V row of 2 * HEAD_DIM bytes, completing on one mbarrier per warp and stage) in place
//       of the 16-byte cp.async: 2-7% slower from 256k tokens (llama2-7b 128 x 1k 522 against
//       503 us) and 1.55x slower on fp8 rows of 128 bytes; a row is too small a request. A
//       whole (block, KV head) tile in one copy needs unpadded rows, which the ldmatrix reads
//       would then hit with 8-way bank conflicts (a swizzled layout needs TMA tensor maps).
//   v5  a bf16 q over an fp8 cache; the prologue reads the block ids of its STAGES
//       tiles together (one block-table round trip, not one per tile); the merge loads its first
//       rows together with the lse. Observed in one session probe (not recorded; each variant
//       timed in turn against v4): 1 x 32k qwen2.5-7b 29.5 -> 28.0 us, llama3-8b on fp8 29.5 ->
//       28.1 us, 1 x 8k llama3-8b 19.1 -> 18.3 us; from 16 x 1k up, within +-1 us. In the same
//       probe the decode launch alone (no merge) took 2-4 us less than decode plus merge, and
//       a paged cache whose blocks lie in order ran 1% slower to 4% faster than a scattered one
//       (the most at 16 x 1k): paging is not what keeps gqa below SDPA at large shapes.
//       Tried and dropped (observed, not recorded): the merge inside the decode launch again,
//       for splits of at most 8 partitions, the last CTA of each (sequence, KV head) merging
//       with every load of a chunk of partitions in flight: -0.5 to +0.8 us against gqa_merge
//       at 2-8 partitions (16 x 1k, 16 x 4k, 4 x 8k), and 2-13 us slower at 16-64. Its
//       __threadfence and counter round trip cost what the merge launch does.
//   v6  seq_len, q and the first block ids are read in one round trip (the block
//       ids no longer wait for seq_len), and the merge reads seq_len before it waits for the
//       decode grid. Observed in a session probe (not recorded; v5 and v6 timed in turn, same
//       split): 0.3-1.0 us less at 1 x 32k, 1 x 8k and 16 x 1k (llama3-8b 1 x 32k 42.2 ->
//       41.5 us, qwen2.5-7b 16 x 1k 19.1 -> 18.5 us), unchanged from 64 x 4k. The split model
//       (kvlab/kernels/geometry.py, split_plan) now counts an SM's turns and the merge: at
//       16 x 1k a CTA an SM without a merge beats two an SM with one by 8-11%.
//       What keeps gqa below SDPA at large shapes (session probes, not recorded; one loop per
//       point): a plain read of the same bytes (one contiguous buffer, 16-byte loads) reaches
//       104% of the copy roofline at llama3-8b 64 x 8k, SDPA 104%, gqa 98%, and gqa with its
//       math compiled out (the same cp.async stream, nothing computed) 98.8%: the loads, not
//       the math. Blocks in order instead of scattered gave +1.3%; V moved by 4 KB, 1 MB + 2 KB
//       or 64 MB against K (DRAM channel camping) gave nothing. Every warp reads its own 4 KB
//       (block, head) tiles; a dense read streams one region. A later probe (same method) ruled
//       out four more: blocks of 16 to 256 tokens (4 to 64 KB contiguous per (block, head)) read
//       at 98.2-98.9% at llama3-8b 64 x 8k, SDPA 103.8%; 8 warps a CTA (one CTA an SM) 97.5%;
//       4-6 stages at one CTA an SM 96.6-97.0% (and 1-3 points slower at 1 x 32k and 16 x 1k:
//       more bytes in flight an SM did not help a lone CTA either); 66 x 8k, whole waves of
//       4 CTAs an SM, 99.1% against SDPA's 105.6%.
//   v7  shared-memory rows 32-byte aligned (stride 288 bytes at fp16 head_dim 128,
//       was 272). Nsight Compute (llama3-8b 64 x 8k) showed why gqa read slower than SDPA: L2
//       served 100.7M sectors to the SMs for 67.1M read from DRAM (SDPA 67.1M for 67.1M), in
//       any cp.async size hint (none, 64B, 128B; 256B 104.9M). Each odd row started 16 bytes
//       into a 32-byte shared-memory sector, and the two 16-byte halves of each of its cache
//       sectors were fetched from L2 apart. With aligned rows L2 serves 67.2M sectors, DRAM
//       throughput rose from 87.5-87.8% to 90.8-91.6% of peak and a launch took 488-493 us
//       instead of 509-511 us (SDPA 482 us), although every ldmatrix phase now meets a 2-way
//       bank conflict (a swizzled layout would remove it). Timed in one loop (session probe,
//       not recorded; % of the copy roofline, before -> after, SDPA): llama3-8b 64 x 8k
//       98.4 -> 102.0 (103.1), 16 x 4k 87.4 -> 91.1 (93.8), 1 x 32k 74.7 -> 77.4 (76.6),
//       16 x 1k 66.7 -> 67.9 (69.4); llama2-7b 64 x 4k 99.0 -> 103.4 (105.8); qwen2.5-7b
//       128 x 4k 96.0 -> 99.5 (102.0).
//   v8  16-bit rows of whole 128-byte lines stored unpadded, their 16-byte chunks
//       swizzled (Smem; fp16 head_dim 128: 256 bytes, was 288), and head_dim 64 back at 4 CTAs
//       an SM. Nsight Compute (llama3-8b 64 x 8k): shared-memory load bank conflicts 16.8M ->
//       553, L2 sectors unchanged (67.15M), a launch 496 -> 487 us. Timed in one loop (session
//       probe, not recorded; % of the copy roofline, v7 -> v8, SDPA): llama3-8b 64 x 8k
//       102.0 -> 102.1 (103.7), 16 x 4k 90.5 -> 91.3 (93.4), 1 x 32k 75.9 -> 77.3 (73.4),
//       16 x 1k 67.8 -> 68.5 (69.4); llama2-7b 64 x 4k 103.4 -> 104.7 (105.8); qwen2.5-7b
//       128 x 4k 99.8 -> 100.7 (102.1), 1 x 32k 58.6 -> 59.3 (55.5); qwen2.5-14b 16 x 1k
//       67.4 -> 68.1 (69.1). Swizzled, fp8 ran 1.2-1.4 points slower at 64 x 8k, 16 x 4k and
//       128 x 4k (equal at 1 x 32k), although its conflicts fell from 8.39M to 510: the XOR
//       addressing adds 28 instructions to its main loop of 453 (ncu: 117.2M -> 124.6M
//       executed), and fp8's loop, with its conversions, is the busier one. fp8 keeps v7's
//       padded rows. Recorded: attention.json, attention_small.json, attention_mixed.json,
//       attention_fp8.json (summed up in benchmarks/README.md).
//       What v8's loads alone reach (two session probes at 12337b8, not recorded): its access
//       pattern (a CTA per partition, KV head and sequence; 4 warps; 3 stages of 16 K and 16 V
//       rows of one (block, head) tile) read with nothing computed, by six load paths, timed in
//       one loop with gqa and SDPA. % of the copy roofline; XOR checksums equal on all paths:
//         point (partition)      cp.async 16B  bulk 4KB  TMA 2D swizzled  ld.global   gqa  SDPA
//         llama3-8b 64 x 8k           103.8     103.0        97.6           98.1     102.3 103.6
//         llama2-7b 64 x 4k           105.5     105.4        99.3          100.0     104.6 105.7
//         qwen2.5-7b 128 x 4k         103.0     101.4        94.8           96.8     100.5 102.3
//         llama3-8b 16 x 4k (2k)       96.4      96.9        89.0           90.9      91.7  93.2
//         llama3-8b 1 x 32k (1k)       89.7      86.4        80.3           84.4      79.2  77.7
//         qwen2.5-14b 1 x 32k (1k)     89.7      87.3        83.0           79.6      76.7  74.2
//         qwen2.5-7b 1 x 32k (512)     76.1      76.6        71.7           71.4      60.7  56.3
//         llama3-8b 16 x 1k (256)      76.7      76.4        69.5           71.2      69.9  68.7
//         qwen2.5-7b 16 x 1k (256)     62.3      58.3        58.1           55.6      42.4  39.1
//       (the first five rows from the first probe, the others from the second; gqa runs its own
//       split.) From 256k tokens the cp.async stream reads as fast as SDPA: what gqa gives up
//       there (1-2.5 points) is its math, not its loads. At the small shapes gqa falls 7-20
//       points behind its own stream: its prologue, math, epilogue and merge, which a plain
//       stream does not have, are what keep 1 x 32k and 16 x 1k below their targets on the
//       8-KV-head models (the stream: 89-90% and 77%); on qwen2.5-7b even the stream is below
//       them. TMA ran 0.7-9.4 points below cp.async, unswizzled (one 16 x 128 box a tile) as
//       swizzled (two 16 x 64 boxes): TMA itself, not the swizzle. One bulk copy a tile matched
//       cp.async at large shapes (it beat it by 4.5 points at llama3-8b 16 x 1k in one probe,
//       not in the other) but lands the rows unswizzled, where ldmatrix meets 8-way bank
//       conflicts; a bulk copy a row into padded rows (v4's way) ran 5.1-22.5 points slower.
//   v9  a cheaper end of the CTA and merge. The warps' results are combined 4 dims
//       a thread: each head's weights once (not once an element) and float4 reads and stores
//       (v8: an element a step, 12 shared loads and 4 exp2 each); the fp8 V scale is read in
//       the prologue, not after the main loop. gqa_merge weighs each slot's partitions against
//       their own largest lse, read together with the rows: one barrier before the sum instead
//       of v8's two block reductions (five barriers). Timed in one loop against v8 (session
//       probe, not recorded; 24 points of the four models, the same split): a split call 0.5-1.7
//       us less (qwen2.5-7b 1 x 32k 26.0 -> 24.6 us, 1 x 8k 13.9 -> 12.7 us; llama3-8b 1 x 32k
//       39.9 -> 39.1 us), an unsplit one at 16 x 1k and 64 x 1k -0.2 to +1.0 us (llama3-8b
//       16 x 1k 23.3 -> 22.4 us), from 256k tokens 0.997-1.008x; fp8 0.3-1.5 us less. With the
//       split model of revision dbb0c6b (two CTAs an SM where they tie with one) recorded in
//       attention*.json: 1 x 32k reaches 80% of the copy roofline on the 8-KV-head models.
//   v10 every batch of mixed lengths, split or not, runs as a work list, and the
//       KV heads of an item are launched together (a 1-D grid, the head the fastest index),
//       so the whole launch runs longest first; v9 ran an unsplit batch in sequence order and
//       a split one head after head. The split model follows that schedule (split_plan).
//       Timed against v9 at the same split (session probe, not recorded; % of the copy
//       roofline): 64 lognormal sequences of max 2k, llama3-8b 83.4 -> 94.0, qwen2.5-7b
//       73.9 -> 77.9; equal lengths 0.99-1.02x. A launch that fits one wave pairs a long and
//       a short CTA on each SM instead (kvlab/kernels/geometry.py, one_wave_order).
//       Recorded: attention_mixed.json.
//       Tried and dropped (observed, not recorded): the scores as S^T = K . Q^T (K the mma's A
//       operand, Q^T its B): one QK mma per 16 tokens and k-step instead of two (v10 pads rows
//       8..15 of Q), a lane's logits those of its O^T columns' heads (no shuffles for the
//       rescale, three for each head's max), P^T's B fragment from movmatrix.trans. Timed
//       against v10 in one loop (36 points of the four models; fp8 too below 256k tokens):
//       0.99-1.03x below 256k tokens, 0.99-1.00x from there (llama3-8b 32 x 16k 489.8 -> 495.0
//       us, SDPA 478.4 us): the mma count is not what keeps gqa behind SDPA there.
//   v11 a lazy online-softmax rescale. A warp moves m, l and O to a new reference only
//       when some head's tile max passes its m by more than RESCALE_SLACK = 8 (log2 units), a
//       warp-uniform vote; otherwise the tile's p = exp2(x - m) stays at most 256 (fp16 and bf16
//       hold it with their usual relative precision) and the alpha exp2, its two shuffles and
//       the 4 * K_STEPS multiplies of O are skipped. Once the first tiles have set m, random and
//       real-like logits rarely pass it by 8. Timed against v10 in one loop (session probe, not
//       recorded; 28 points of the four models, fp8 at 8 of them; max |v10 - v11| 1.5e-5 to
//       2.4e-4 on fp16 outputs): 0.987-1.016x, median 1.003x; from 256k tokens 0.997-1.009x,
//       median 1.002x (llama2-7b 64 x 8k 1928 -> 1922 us, SDPA 1900 us). Not what keeps gqa
//       behind SDPA at large shapes either. Recorded (revision 3ac2b5d): attention.json,
//       attention_mixed.json, attention_sms.json and the counters files.
//       Tried and dropped (observed, not recorded): the merge inside the decode launch a third
//       time, in parallel. An equal-length split of n <= 16 partitions ran as a thread-block
//       cluster of n CTAs (non-portable above 8); each CTA left its (O, lse) in shared memory,
//       and after a cluster barrier each merged a share of the group's dims, reading the others'
//       through distributed shared memory (mapa, ld.shared::cluster). Outputs matched the merge
//       launch's (GPU tests at 2, 5, 8 and 16 partitions). Timed against gqa_merge at the same
//       split in one loop (36 points of the four models, 2 and 4 partitions at each, 8 and 16 at
//       the 28 from 4k tokens a sequence), the cluster's time over the merge launch's:
//       n = 2 median 0.983 (0.913-1.026), 4: 1.039 (0.981-1.282), 8: 1.092 (1.003-1.344),
//       16: 1.261 (1.090-1.474); llama2-7b 1 x 32k at 8 partitions 169.9 against 129.5 us,
//       llama3-8b at 16 45.3 against 39.8 us. Best clustered split against the best merge-launch
//       split: ahead at 5 of 36 points, by at most 1.2%, within the spread of two launches of one
//       plan at 16 us calls. compute-sanitizer memcheck flagged the build (34 errors, not
//       investigated). Why the clusters ran slower was not measured (a guess, untested: a
//       cluster's CTAs must be placed together on one GPC, and all wait at the barrier for the
//       slowest).
//   v12 CTAs of 8 warps (WARPS), 128-token tiles, twice the stages, one CTA an SM at
//       head_dim 128. A lone CTA of 4 warps handles about 86M tokens/s (kvlab/kernels/geometry.py):
//       where a launch has fewer CTAs than that rate needs to keep HBM busy (fp16: fewer than 98
//       at head_dim 128; fp8, whose tokens carry half the bytes: fewer than 195), the split model
//       had to split them into pairs of CTAs an SM and merge. 8 warps read about as fast as a pair
//       without the merge; the split model weighs them (split_plan). Timed against 4 warps at
//       forced partition sizes (session probe at revision 93d7cc5, not recorded; 9 shapes of the
//       four models, fp16 and fp8 at three, one loop a point; outputs equal to 6e-5, 2.4e-4 on
//       mixed batches): fp8 16 x 8k unsplit 87.2% of the copy roofline against 83.3-84.3% for
//       the best of 4 warps (2 partitions), 16 x 32k 97.6-97.8% against 95.2%; qwen2.5-7b fp16
//       16 x 1k 49.8% against 46.8% (4 partitions). Where lone CTAs of 4 keep HBM busy, 8 did
//       not help: fp16 16 x 8k and 16 x 32k (128 CTAs of 4 or 8 warps) -1.2 to +0.9 points, so
//       the gap to SDPA there (96.4-97.3% against 99.4-99.7% at 16 x 8k) is not the bytes in
//       flight an SM (8 warps hold twice as many); against pairs of 4-warp CTAs, 8 warps ran
//       0.1-4 points slower (llama2-7b 1 x 32k 93.7% against 96.7%); on mixed batches 0.3-4.3
//       points slower; at partitions of 256 tokens (2 tiles a warp) 0.9 points slower where 128
//       CTAs were lone (qwen2.5-7b 1 x 8k), 7.8-8.5 where 256 CTAs took two waves. The split model
//       offers 8 warps only where lone CTAs of 4 cannot keep HBM busy, on equal lengths, for
//       partitions of 512 tokens or more (4 tiles a warp). A second probe (the plans with and
//       without 8 warps in one loop, 15 points of the recorded grids, whole GPU and green
//       contexts of 32 and 80 SMs): 1.007-1.13x at 13 (qwen2.5-7b 16 x 4k on 80 SMs 78.8 ->
//       86.3%, llama2-7b 1 x 4k on 32 SMs 81.1 -> 86.5%), 0.974x and 0.984x at two whose lone
//       CTAs were HBM-bound (1 x 32k on 80 SMs), which the fitted model now leaves at 4 warps.
//       Recorded (revision bcfeff1): attention.json (two points run 8 warps),
//       attention_small.json, attention_fp8.json, attention_bf16.json, attention_sms.json.
//       What is left against SDPA from 256k tokens is mostly where the blocks lie: the benchmarks
//       scatter them over the pool; in order (attention_block_order.json, revision 4b3b419) gqa
//       ran 0.992-1.017x SDPA there on the 8-KV-head models, against 0.979-1.012x scattered
//       (benchmarks/README.md, "Blocks in order").
//       Where a small step's time goes, CTA by CTA (timeline.json, revision 1be3641; benchmarks/
//       README.md, "Where a small step's time goes"): a CTA holds its first block ids 0.26-0.51 us
//       after it starts and its first tile 2.0-3.9 us after; it spends 0.51-0.80 us after its
//       loop; the merge ends 1.9-2.4 us after the decode grid's last CTA.
//       Tried and dropped (observed, not recorded; one loop a point against the build before,
//       12 points of the four models): K/V copies tagged L2::evict_first (createpolicy), so that
//       streamed K/V would not evict the partials before the merge reads them, timed together
//       with the merge's index math moved ahead of its wait (kept): 0.992-1.009x, median 1.003x,
//       and the merge took as long.
//   v13 this file: a sequence of one partition is written by its decode CTA, not merged. A
//       mixed batch's merge is launched over its split sequences only (`seqs`); on the natural
//       grid, whose lengths the host may not know (a plan captured for replay), the merge CTAs
//       of such a sequence return before their wait, and CTA (0, 0) waits whatever its sequence,
//       so that the merge grid still ends after the decode grid. v12 launched a merge CTA for
//       every sequence and query head: at 64 lognormal sequences of max 16k, 1,792-2,560 CTAs,
//       most of which could start only once decode CTAs had ended, and its merge ended 8.2-10.7
//       us after the decode grid's last CTA (timeline_mixed.json at revision 76d5db5). Timed
//       against v12 in one loop (session probe, not recorded; 21 points of the four models;
//       outputs bit-equal): 64 long sequences (max 16k and 32k) 1.022-1.052x (qwen2.5-7b 88.2 ->
//       92.7% of the copy roofline), 16 long ones 0.999-1.023x, 16 short ones (max 2k)
//       0.982-1.044x; unsplit points, whose launches did not change, 0.994-1.002x. Recorded
//       (revision 717010b): attention_mixed.json, and timeline_mixed.json, where that merge now
//       ends 2.8-4.9 us after the decode grid.
//       Tried and dropped (observed, not recorded): gqa_merge with LOADS = 8, not 16. ptxas
//       gives the merge 127 registers at head_dim 128 (64 with LOADS = 8) and the decode 151,
//       so one merge CTA fits an SM beside two decode CTAs and four once they end; in the
//       timeline of 64 long sequences, 25-40% of the 704-880 merge CTAs started after the
//       decode grid's last CTA. Timed in one loop against v13 (12 points): 64 long sequences
//       1.001-1.009x, 16 sequences 0.989-1.017x, 1 x 32k 1.002-1.014x at 8 and 32 partitions,
//       and 0.954x at qwen2.5-7b's 64, whose partials then take more round trips.
//       Tried and dropped (observed, not recorded): a streamed launch for batches of mixed
//       lengths (the issue's persistent grid). The batch's tiles, its sequences laid end to end,
//       were cut into ranges of equal work, 2 x num_sms / num_kv_heads of them, a CTA a (range,
//       KV head), all resident at once. A CTA walked its range's pieces (a span of one sequence
//       each) with one cp.async pipeline that ran on into the next piece (whose q it copied,
//       with the last tile, into a ring in shared memory), combined its warps at each piece's
//       end (two CTA barriers, through the stage it had just read), and gqa_merge combined the
//       pieces of the sequences a cut had split. Outputs matched the reference in 152 cases
//       (every head_dim and 16-bit dtype, fp8, groups 1-8, blocks 8-256, prefetch, up to 160
//       pieces a range). Timed against the work list in one loop, both on the same build (26
//       points of the four models, batches 16 to 256, max 2k to 32k): 0.885-0.996x, median
//       0.968x (llama2-7b 64 sequences of max 16k 105.6 -> 102.2% of the copy roofline, qwen2.5-7b
//       64 of max 2k 77.7 -> 69.0%, where it adds a merge the work list does not need). With 2,
//       4 and 8 times as many ranges (smaller pieces, finer balance) it ran slower still,
//       0.64-0.98x of the work list (a second probe, 7 points): more pieces, each ending in two
//       barriers, and more split sequences to merge cost more than the finer balance saved
//       (which of the two weighs more was not measured). The work list's uneven CTA ends cost
//       less: the CTAs that follow them start their copies at once. (In other runs of the same
//       session v13 ran 7 of those work lists 0.4-5.5% faster than that build did.)
//       Rechecked at v13 in two more session probes (not recorded; one loop a point): L2
//       prefetch (bulk and line, distances 1, 2 and 4, evict-last) on the mixed batches, whose
//       short CTAs leave long ones alone on their SMs, ran 0.70-0.92x of none (7 points), and
//       0.74-0.96x at 16 x 1k, 16 x 8k and 1 x 32k; partitions of the whole sequence down to
//       a 32nd of it (7 sizes), with 4 and 8 warps, at 16 x 1k, 16 x 4k, 16 x 8k, 8 x 4k and
//       1 x 32k of llama3-8b and qwen2.5-14b: the plan's choice was within 1.5 points of the
//       fastest (two launches of one plan differed by up to 0.9), and no choice reached SDPA at
//       16 x 4k or 16 x 8k (best 92.7-97.9% against 93.4-99.4%).
//       Tried and dropped (observed, not recorded): work stealing, for the tail that the CTAs'
//       unequal shares of HBM leave (benchmarks/README.md, "Blocks in order"), in two designs
//       timed against v13 in one loop at llama3-8b 16 x 4k and 16 x 8k (128 lone CTAs). Both
//       kept an atomic word a CTA (front, back, two flags): its owner claimed from the front, a
//       CTA done with its own partition took the open word with the most left and claimed from
//       its back, and left its share (O, lse) for the owner, which waited for it and added it
//       before writing. Outputs matched v13.
//       - Each warp claimed units of 16 tokens, c at a time, its next claim issued c units
//         before its use. Each claim cost a whole round trip, 0.55-0.68 us, however far ahead
//         it was issued (3 to 32 units, 3 to 30 us): c = 3, 4, 8, 16, 32 ran 0.85, 0.86, 0.94,
//         0.97, 0.98x as fast at 16 x 8k, 0.82, 0.85, 0.93, 0.96, 0.98x at 16 x 4k.
//       - A fifth warp claimed the CTA's tiles, 1 or 2 a claim, and kept 2 tiles owned past
//         the compute warps' next loads, which waited in shared memory where a tile was not
//         yet owned: 0.94-0.96x at both points.
//       In neither did a thief find work: 0-1 steals in a launch of 128 CTAs, at thresholds of
//       2 to 8 units or tiles left. In timeline.json's traces of 16 x 4k, when the first CTA
//       ends the slowest has about 6 tiles (of 64 tokens) left and the median one 3, while the
//       claims held work ahead of the math to hide their round trip: 4-5 tiles (the claim
//       warp), up to 2c units a warp (the warps' own claims). The bound it aimed at, from the
//       same traces: were every CTA to keep its measured rate to one common end, the last loop
//       would end 2.7-3.2 us sooner at 16 x 4k and 2.8-3.0 us at 1 x 32k (8-KV-head models),
//       before the owner's wait for its thief.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "prefetch.cuh"
#include "timeline.cuh"

namespace kvlab {

// An fp8 element (e4m3, bit pattern only: the kernel widens pairs with cvt.rn.f16x2.e4m3x2).
struct fp8_e4m3 {
  unsigned char bits;
};

namespace gqa {

constexpr int WARP_TOKENS = 16;  // rows of a tile owned by one warp (a tile: 16 x WARPS rows)
constexpr int MAX_GROUP = 8;                           // the n-width of one mma
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr float RESCALE_SLACK = 8.f;  // log2 units: p and the O scale grow by at most 256x

template <bool C, typename A, typename B> struct Select { using type = A; };
template <typename A, typename B> struct Select<false, A, B> { using type = B; };
template <typename A, typename B> struct Same { static constexpr bool value = false; };
template <typename A> struct Same<A, A> { static constexpr bool value = true; };

// Shared-memory geometry, in bytes. One warp's K (or V) rows of one stage: [WARP_TOKENS][ROW_BYTES],
// in 16-byte chunks. A 16-bit row that fills whole 128-byte lines (head_dim 64, 128, 256) is
// stored unpadded with its chunks swizzled: chunk c of row r sits at chunk c ^ (r % 8). The 8 rows
// of an ldmatrix phase then read 8 different bank groups (no conflict), and the two chunks of a
// 32-byte cache sector stay in one 32-byte shared-memory sector (the XOR keeps or swaps them in
// place). Any other row, and every fp8 row (swizzled, fp8 ran 1.2-1.4 points slower: see v8), is
// padded to the least odd multiple of 32 bytes that holds it (and, for fp8 at head_dim 80 and
// 112, the 16 bytes its last ldmatrix reads past it), chunks in order: a multiple of 32, so that
// the two chunks of a sector land in one shared-memory sector (a row 16 bytes off makes L2 serve
// that sector twice; see v7); odd, so that an ldmatrix phase meets a 2-way bank conflict, not
// more. Whole buffer: [STAGES][NUM_WARPS][K, V][WARP_TOKENS][ROW_BYTES]. fp8 keeps 5 stages (see
// the header).
// CTAS_PER_SM is what shared memory allows on sm_90 (228 KB per SM, 1 KB reserved per CTA):
// 4 CTAs for head_dim 64, 3 for 80, 2 for 96..128, 1 for 256 (fp8: 3, 3, 3, 2, 2, 1).
// It is passed to __launch_bounds__ so that ptxas budgets registers for that occupancy instead of
// guessing (its guess spilled at 96).
template <int HEAD_DIM, int KV_BYTES, int WARPS> struct Smem {
  static constexpr int MIN_ROW_BYTES =
      HEAD_DIM * KV_BYTES + (KV_BYTES == 1 && HEAD_DIM % 32 != 0 ? 16 : 0);
  static constexpr bool SWIZZLE = KV_BYTES == 2 && MIN_ROW_BYTES % 128 == 0;
  static constexpr int ROW_BYTES =
      SWIZZLE ? MIN_ROW_BYTES : 32 * (((MIN_ROW_BYTES + 31) / 32) | 1);
  static constexpr int STAGES = KV_BYTES == 1 ? 5 : 3;
  static constexpr int WARP_TILE_BYTES = WARP_TOKENS * ROW_BYTES;
  static constexpr int BYTES = STAGES * WARPS * 2 * WARP_TILE_BYTES;  // the dynamic smem
  static constexpr int CTAS_PER_SM = (228 * 1024) / (BYTES + 1024);
  static_assert(CTAS_PER_SM >= 1, "WARPS: 8 only where its shared memory fits an SM");
  // What row `row`'s chunk indices are XORed with (host too: tests check the layout).
  static constexpr __host__ __device__ int key(int row) { return SWIZZLE ? row & 7 : 0; }
  // Byte offset of chunk `chunk` of row `row` in a warp's tile.
  static constexpr __host__ __device__ int at(int row, int chunk) {
    return row * ROW_BYTES + 16 * (chunk ^ key(row));
  }
};

// ---- small PTX helpers --------------------------------------------------------------------------

__device__ __forceinline__ unsigned smem_addr(const void* p) {  // generic -> .shared address
  unsigned addr;
  asm("{ .reg .u64 u; cvta.to.shared.u64 u, %1; cvt.u32.u64 %0, u; }" : "=r"(addr) : "l"(p));
  return addr;
}

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }  // no <cmath>

// 16-byte global -> shared copy; when !valid nothing is read and the 16 bytes are zero-filled.
// .L2::128B lets L2 fetch the whole 128-byte line from HBM on the first miss (see the header's
// log: an observed gain, not a recorded one).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}

// Two e4m3 values (the low byte first) widened to an fp16 pair, exactly.
__device__ __forceinline__ unsigned e4m3x2_to_half2(unsigned short pair) {
  unsigned out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(pair));
  return out;
}

__device__ __forceinline__ float2 bf16x2_to_float2(unsigned pair) {  // the low half is .x
  return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: exp2(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// d[16x8, fp32] += a[16x16, row] * b[16x8, col]; fragments in the standard mma.m16n8k16 layout.
template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                             unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                             unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// ---- paging: which blocks hold a warp's 16 rows ------------------------------------------------

// Physical block ids of the rows [row0, row0 + 16) of the sequence: one id when BLOCK_SIZE >= 16,
// two (rows 0-7, 8-15) when BLOCK_SIZE == 8. Entries at or past `end` (= min(partition end,
// seq_len)) are never read from the block table (NOTE: it is padded with 0 there; we do not rely
// on that).
template <int BLOCK_SIZE> struct RowBlocks {
  static constexpr int N = BLOCK_SIZE >= WARP_TOKENS ? 1 : WARP_TOKENS / BLOCK_SIZE;  // 1 or 2
  static_assert(N <= 2, "of_row assumes at most two blocks per warp");
  int id[N];
  __device__ __forceinline__ void lookup(const int* __restrict__ table_row, int row0, int end) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int t = row0 + i * BLOCK_SIZE;
      id[i] = t < end ? table_row[t / BLOCK_SIZE] : 0;
    }
  }
  // The block of row r (0..15) of the warp: a select, not a runtime index (id[] stays in regs).
  __device__ __forceinline__ int of_row(int r) const {
    if constexpr (N == 1) return id[0];
    else return r < BLOCK_SIZE ? id[0] : id[1];
  }
};

// Element offset of the (block, kv head) tile: [num_blocks, num_kv_heads, BLOCK_SIZE, HEAD_DIM].
template <int HEAD_DIM, int BLOCK_SIZE>
__device__ __forceinline__ long long tile_offset(int block_id, int num_kv_heads, int kv_head) {
  return (static_cast<long long>(block_id) * num_kv_heads + kv_head) * (BLOCK_SIZE * HEAD_DIM);
}

// ---- the decode body ---------------------------------------------------------------------------

template <typename T, typename KV, int HEAD_DIM, int BLOCK_SIZE, int GROUP, int PF_MODE, bool PF_K,
          bool PF_V, int PF_DIST, bool PF_EVICT_LAST, int WARPS>
__device__ __forceinline__ void decode_body(
    T* __restrict__ out, float* __restrict__ partial_out, float* __restrict__ partial_lse,
    const T* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ work, int max_num_blocks_per_seq, int num_kv_heads,
    int partition_size, int max_num_partitions, float scale) {
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 80 || HEAD_DIM == 96 || HEAD_DIM == 112 ||
                HEAD_DIM == 128 || HEAD_DIM == 256, "HEAD_DIM: 64, 80, 96, 112, 128 or 256");
  static_assert(BLOCK_SIZE >= 8 && BLOCK_SIZE <= 256 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
                "BLOCK_SIZE: a power of two in [8, 256]");
  static_assert(GROUP >= 1 && GROUP <= MAX_GROUP, "GROUP: 1..8");
  static_assert(PF_MODE == PF_NONE || PF_MODE == PF_BULK || PF_MODE == PF_LINE, "PF_MODE");
  static_assert(PF_MODE == PF_NONE || PF_DIST >= 1, "PF_DIST: >= 1 tile");
  static_assert(sizeof(T) == 2, "T: __half or __nv_bfloat16");
  constexpr bool FP8 = sizeof(KV) == 1;
  static_assert(sizeof(KV) == sizeof(T) || FP8, "KV: T or fp8_e4m3");
  using MT = typename Select<FP8, __half, T>::type;  // the mmas' inputs: fp8 widens to fp16
  static_assert(WARPS == 4 || WARPS == 8, "WARPS: 4 or 8");
  using S = Smem<HEAD_DIM, sizeof(KV), WARPS>;
  constexpr int NUM_WARPS = WARPS;
  constexpr int NUM_THREADS = 32 * WARPS;
  constexpr int TILE_TOKENS = WARPS * WARP_TOKENS;  // tokens per main-loop iteration: 64 or 128
  constexpr int STAGES = S::STAGES;
  constexpr int K_STEPS = HEAD_DIM / 16;           // 16-dim k-steps of QK = 16-dim m-tiles of PV
  constexpr int ROW_BYTES = S::ROW_BYTES;          // smem row stride
  constexpr int VECS = HEAD_DIM * sizeof(KV) / 16;  // 16-byte vectors per row
  constexpr int VEC_ELEMS = 16 / sizeof(KV);
  constexpr int COPIES = (WARP_TOKENS * VECS + 31) / 32;  // cp.async per lane per cache per tile
  constexpr int RUN = BLOCK_SIZE < TILE_TOKENS ? BLOCK_SIZE : TILE_TOKENS;  // prefetch call, tokens
  constexpr bool PREFETCH = PF_MODE != PF_NONE && (PF_K || PF_V);

  namespace tl = timeline::decode;
  timeline::start(tl::REGION, tl::ENTRY);
  // the natural grid, or a work list of (sequence, partition) pairs (see the launch contract)
  const int item = blockIdx.x / num_kv_heads;
  const int partition = work ? work[2 * item + 1] : blockIdx.x;
  const int seq = work ? work[2 * item] : blockIdx.z;
  const int kv_head = work ? blockIdx.x % num_kv_heads : blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // seq_len, q and the first block ids are read together: one round trip before the first
  // cp.async, not two (the block ids do not wait for seq_len; see `first` below)
  const int seq_len = seq_lens[seq];
  const int partition_start = partition * partition_size;
  const int num_qo_heads = num_kv_heads * GROUP;
  const int* __restrict__ table_row =
      block_tables + static_cast<long long>(seq) * max_num_blocks_per_seq;  // this seq's row
  // fp8: stored K = K / k_scale, so the logits take k_scale; the output takes v_scale (below)
  float scale_log2 = scale * LOG2E * (FP8 ? k_scale[kv_head] : 1.f);
  const float out_scale = FP8 ? v_scale[kv_head] : 1.f;  // read now, not after the main loop

  unsigned long long policy = 0;
  if constexpr (PREFETCH && PF_EVICT_LAST) policy = make_evict_last_policy();

  // Shared memory: [STAGES][NUM_WARPS][K, V][WARP_TOKENS][ROW_BYTES].
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int WARP_TILE_BYTES = S::WARP_TILE_BYTES;
  auto stage_k = [&](int stage) {
    return smem_raw + (stage * NUM_WARPS + warp) * 2 * WARP_TILE_BYTES;
  };
  auto stage_v = [&](int stage) { return stage_k(stage) + WARP_TILE_BYTES; };
  auto warp_row0 = [&](int tile) {
    return partition_start + tile * TILE_TOKENS + warp * WARP_TOKENS;
  };

  // Q of the group as mma A fragments (rows = query heads, rows >= GROUP and 8..15 are zero):
  // q_frag[s][0] = Q[g][16s + 2(lane%4) + {0,1}], q_frag[s][1] = Q[g][16s + 8 + 2(lane%4) + {0,1}],
  // g = lane / 4; fp8: Q[g][16s + 4(lane%4) + {0,1}] and + {2,3}, the dims K's lane holds.
  // q is [num_seqs, num_qo_heads, HEAD_DIM]; the group's heads are consecutive.
  unsigned q_frag[K_STEPS][2];
  {
    const int g = lane / 4;
    const long long head = static_cast<long long>(seq) * num_qo_heads + kv_head * GROUP + g;
    const T* qg = q + head * HEAD_DIM + (FP8 ? 4 : 2) * (lane % 4);
    constexpr int HI = FP8 ? 2 : 8;  // where the k + 8 half of the fragment starts
#pragma unroll
    for (int s = 0; s < K_STEPS; ++s) {
      q_frag[s][0] = g < GROUP ? *reinterpret_cast<const unsigned*>(qg + 16 * s) : 0u;
      q_frag[s][1] = g < GROUP ? *reinterpret_cast<const unsigned*>(qg + 16 * s + HI) : 0u;
    }
    if constexpr (FP8 && !Same<T, __half>::value) {  // bf16 q to fp16 (see the header)
      float amax = 0.f;
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 f = bf16x2_to_float2(q_frag[s][h]);
          amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the quad holds head g
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      // amax in [2^e, 2^(e+1)): q * 2^-shift has its largest |entry| in [2^14, 2^15)
      const int e = ((__float_as_int(amax) >> 23) & 0xff) - 127;
      const int shift = min(max(e - 14, -126), 126);
      const float down = __int_as_float((127 - shift) << 23);
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 f = bf16x2_to_float2(q_frag[s][h]);
          q_frag[s][h] = Mma<__half>::pack(f.x * down, f.y * down);
        }
      scale_log2 *= __int_as_float((127 + shift) << 23);  // this lane's logits are head g's
    }
  }

  // The block ids of the first STAGES tiles (and of the tiles they prefetch), read before
  // seq_len is known: bounded by the partition and the block table's row only, so an id past
  // seq_len may be padding or garbage. Such ids are never used: the copies and prefetches check
  // each row against partition_end.
  RowBlocks<BLOCK_SIZE> first[STAGES], pf_first[STAGES] = {};
  {
    const int table_end = max_num_blocks_per_seq * BLOCK_SIZE;
    const int bound = max_num_partitions == 1 ? table_end
                                              : min(partition_start + partition_size, table_end);
#pragma unroll
    for (int tile = 0; tile < STAGES; ++tile) {
      first[tile].lookup(table_row, warp_row0(tile), bound);
      if constexpr (PREFETCH) pf_first[tile].lookup(table_row, warp_row0(tile + PF_DIST), bound);
    }
  }

  timeline::stamp_after(tl::REGION, tl::READY, first[0].id[0] ^ seq_len);
  // NOTE: partition 0 always runs, so that an empty sequence still gets (zero) outputs.
  if (partition > 0 && partition_start >= seq_len) return;
  const int partition_end =
      max_num_partitions == 1 ? seq_len : min(partition_start + partition_size, seq_len);
  const int num_tiles = (partition_end - partition_start + TILE_TOKENS - 1) / TILE_TOKENS;  // <= 0

  // Copy this warp's 16 K and V rows of `tile` into `stage` (rows >= partition_end zero-filled).
  auto load_tile = [&](int tile, int stage, const RowBlocks<BLOCK_SIZE>& blocks) {
    const int row0 = warp_row0(tile);
    // warp-uniform: this warp's rows of the last tile are all empty
    if (row0 >= partition_end) return;
    unsigned char* const ks = stage_k(stage);
    unsigned char* const vs = stage_v(stage);
#pragma unroll
    for (int i = 0; i < COPIES; ++i) {
      const int c = lane + 32 * i;
      if ((WARP_TOKENS * VECS) % 32 != 0 && c >= WARP_TOKENS * VECS) break;  // fp8 d 80, 112
      const int r = c / VECS, v = c % VECS;
      // Row in its block: row0 is 16-aligned, so rows never wrap within a block when
      // BLOCK_SIZE >= 16, and with BLOCK_SIZE 8 rows 8..15 start the second block.
      const int row_in_block = (row0 & (BLOCK_SIZE - 1)) + (r & (BLOCK_SIZE - 1));
      const long long off =
          tile_offset<HEAD_DIM, BLOCK_SIZE>(blocks.of_row(r), num_kv_heads, kv_head) +
          row_in_block * HEAD_DIM + v * VEC_ELEMS;
      const bool valid = row0 + r < partition_end;
      cp_async_16(ks + S::at(r, v), valid ? k_cache + off : k_cache, valid);
      cp_async_16(vs + S::at(r, v), valid ? v_cache + off : v_cache, valid);
    }
  };

  // L2 prefetch of the runs of `tile` that start in this warp's rows.
  auto prefetch_tile = [&](int tile, const RowBlocks<BLOCK_SIZE>& blocks) {
    const int row0 = warp_row0(tile);
#pragma unroll
    for (int i = 0; i < RowBlocks<BLOCK_SIZE>::N; ++i) {
      if (RUN > WARP_TOKENS && (warp * WARP_TOKENS) % RUN != 0) continue;
      const int run0 = row0 + i * RUN;
      const int num_tokens = min(RUN, partition_end - run0);
      if (num_tokens <= 0) continue;
      const long long off = tile_offset<HEAD_DIM, BLOCK_SIZE>(blocks.id[i], num_kv_heads, kv_head) +
                            (run0 & (BLOCK_SIZE - 1)) * HEAD_DIM;
      const unsigned bytes = num_tokens * HEAD_DIM * sizeof(KV);
      if constexpr (PF_K)
        prefetch_tile_l2<PF_MODE, PF_EVICT_LAST>(k_cache + off, bytes, lane, 32, policy);
      if constexpr (PF_V)
        prefetch_tile_l2<PF_MODE, PF_EVICT_LAST>(v_cache + off, bytes, lane, 32, policy);
    }
  };

  // Online-softmax state. Lane holds head g = lane / 4 for m and its partial l (its 4 scores per
  // tile); o[s] is the O^T fragment of dims 16s..16s+15: o[s][0..1] = (dim 16s + lane/4, heads
  // 2(lane%4) + {0,1}), o[s][2..3] = same heads, dim + 8.
  float m = neg_inf(), l = 0.f;
  float o[K_STEPS][4];
#pragma unroll
  for (int s = 0; s < K_STEPS; ++s) o[s][0] = o[s][1] = o[s][2] = o[s][3] = 0.f;

  // ldmatrix: matrix j = lane / 8 covers tokens (j / 2) * 8 + (0..7), this lane's row lm_row, and
  // chunk (j % 2) of each pair of chunks the loop names by its even first one, c: dims (j % 2) * 8
  // + (0..7) of a 16-dim step (fp8: dims (j % 2) * 16 + (0..15), a step of its own). Since c is
  // even, c + j % 2 = c ^ (j % 2), and the lane's chunk is stored at c ^ lm_key (see Smem).
  const int lm_row = (lane / 16) * 8 + lane % 8;
  const int lm_key = ((lane / 8) % 2) ^ S::key(lm_row);
  auto lm_at = [&](int c) { return lm_row * ROW_BYTES + 16 * (c ^ lm_key); };

  auto compute_tile = [&](int tile, int stage) {
    const int row0 = warp_row0(tile);
    if (row0 >= partition_end) return;  // warp-uniform
    const unsigned char* const ks = stage_k(stage);
    const unsigned char* const vs = stage_v(stage);

    // S[head][token] for tokens 0-7 (s_acc[0]) and 8-15 (s_acc[1]); rows 8-15 of the mma unused.
    float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (FP8) {
#pragma unroll
      for (int s = 0; s < K_STEPS; s += 2) {  // one ldmatrix: steps s (kb0, kb2), s + 1 (kb1, kb3)
        unsigned kb[4];
        ldmatrix_x4(kb, ks + lm_at(s));
#pragma unroll
        for (int j = 0; j < 2 && s + j < K_STEPS; ++j) {
          const unsigned lo = kb[j], hi = kb[2 + j];  // tokens 0-7, 8-15
          Mma<MT>::run(s_acc[0], q_frag[s + j][0], 0u, q_frag[s + j][1], 0u,
                       e4m3x2_to_half2(lo & 0xffff), e4m3x2_to_half2(lo >> 16));
          Mma<MT>::run(s_acc[1], q_frag[s + j][0], 0u, q_frag[s + j][1], 0u,
                       e4m3x2_to_half2(hi & 0xffff), e4m3x2_to_half2(hi >> 16));
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s) {
        unsigned kb[4];  // B fragments: tokens 0-7 {kb0, kb1}, tokens 8-15 {kb2, kb3}
        ldmatrix_x4(kb, ks + lm_at(2 * s));
        Mma<MT>::run(s_acc[0], q_frag[s][0], 0u, q_frag[s][1], 0u, kb[0], kb[1]);
        Mma<MT>::run(s_acc[1], q_frag[s][0], 0u, q_frag[s][1], 0u, kb[2], kb[3]);
      }
    }

    // Scaled logits (log2 domain) of tokens row0 + 8n + 2(lane%4) + j; masked past partition_end.
    float x[2][2];
    float tile_max = neg_inf();
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool valid = row0 + 8 * n + 2 * (lane % 4) + j < partition_end;
        x[n][j] = valid ? s_acc[n][j] * scale_log2 : neg_inf();
        tile_max = fmaxf(tile_max, x[n][j]);
      }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    // Lazy rescale: m, l and O move to a new reference only when some head's tile max passes its
    // m by more than RESCALE_SLACK (warp-uniform); otherwise p = exp2(x - m) <= 2^RESCALE_SLACK.
    if (__any_sync(0xffffffffu, tile_max > m + RESCALE_SLACK)) {
      const float m_new = fmaxf(m, tile_max);
      const float alpha = fast_exp2(m - (m_new == neg_inf() ? 0.f : m_new));  // m = -inf: 0
      l *= alpha;
      m = m_new;
      // O^T columns of this lane are heads 2(lane%4) and 2(lane%4) + 1: fetch their alpha.
      const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * (lane % 4));
      const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * (lane % 4) + 4);
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s) {
        o[s][0] *= alpha0; o[s][1] *= alpha1; o[s][2] *= alpha0; o[s][3] *= alpha1;
      }
    }
    const float m_ref = m == neg_inf() ? 0.f : m;  // no valid token yet: keep p = 0
    float p[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) p[n][j] = fast_exp2(x[n][j] - m_ref);
    l += (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);

    // P^T as the mma B fragment: (tokens 2(lane%4) + {0,1}, head lane/4) and tokens + 8.
    const unsigned pb0 = Mma<MT>::pack(p[0][0], p[0][1]);
    const unsigned pb1 = Mma<MT>::pack(p[1][0], p[1][1]);
    if constexpr (FP8) {
#pragma unroll
      for (int s = 0; s < K_STEPS; s += 2) {  // one ldmatrix: m-tiles s (vt0, vt2), s + 1 (vt1, vt3)
        unsigned vt[4];  // lane: tokens 2(lane%4), +1 (low, high half) x dims 2(lane/4), +1
        ldmatrix_x4_trans(vt, vs + lm_at(s));
#pragma unroll
        for (int j = 0; j < 2 && s + j < K_STEPS; ++j) {
          const unsigned lo = vt[j], hi = vt[2 + j];  // tokens 0-7, 8-15
          // rows lane/4 <- dim 2(lane/4) (bytes 0, 2), rows lane/4 + 8 <- dim 2(lane/4) + 1
          const unsigned a0 = e4m3x2_to_half2(__byte_perm(lo, 0u, 0x0020) & 0xffff);
          const unsigned a1 = e4m3x2_to_half2(__byte_perm(lo, 0u, 0x0031) & 0xffff);
          const unsigned a2 = e4m3x2_to_half2(__byte_perm(hi, 0u, 0x0020) & 0xffff);
          const unsigned a3 = e4m3x2_to_half2(__byte_perm(hi, 0u, 0x0031) & 0xffff);
          Mma<MT>::run(o[s + j], a0, a1, a2, a3, pb0, pb1);
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s) {
        unsigned va[4];  // A fragment of V^T[dims 16s.., tokens 0-15]
        ldmatrix_x4_trans(va, vs + lm_at(2 * s));
        Mma<MT>::run(o[s], va[0], va[1], va[2], va[3], pb0, pb1);
      }
    }
  };

  // ---- main loop: per-warp pipeline of STAGES stages ----------------------------------------
#pragma unroll
  for (int tile = 0; tile < STAGES - 1; ++tile) {
    if (tile < num_tiles) {
      load_tile(tile, tile, first[tile]);
      if constexpr (PREFETCH) {
        if (tile + PF_DIST < num_tiles) prefetch_tile(tile + PF_DIST, pf_first[tile]);
      }
    }
    cp_async_commit();
  }
  timeline::stamp(tl::REGION, tl::ISSUED);
  // Block ids for the next load (and its prefetch) are looked up one iteration early, so the
  // block-table read overlaps the math instead of stalling the cp.async issue.
  RowBlocks<BLOCK_SIZE> blocks = first[STAGES - 1], pf_blocks = pf_first[STAGES - 1];

  int read_stage = 0, write_stage = STAGES - 1;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + STAGES - 1;  // tile to load now, into the stage read last iteration
    __syncwarp();                        // every lane is done reading write_stage
    if (next < num_tiles) {
      load_tile(next, write_stage, blocks);
      if constexpr (PREFETCH) {
        if (next + PF_DIST < num_tiles) prefetch_tile(next + PF_DIST, pf_blocks);
      }
    }
    cp_async_commit();  // always, possibly empty: keeps "tile t = group t" for wait_group
    blocks.lookup(table_row, warp_row0(next + 1), partition_end);
    if constexpr (PREFETCH)
      pf_blocks.lookup(table_row, warp_row0(next + 1 + PF_DIST), partition_end);

    cp_async_wait<STAGES - 1>();  // this lane's copies of `tile` have landed ...
    __syncwarp();                 // ... and every lane's are visible to the warp
    if (tile == 0) timeline::stamp(tl::REGION, tl::LANDED);
    compute_tile(tile, read_stage);
    read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
  }
  cp_async_wait<0>();  // only empty groups remain; drained before the stages are reused
  __syncthreads();     // all warps done with the stages
  timeline::stamp(tl::REGION, tl::LOOP_DONE);

  // ---- merge the 4 warps (aliases the stages) -----------------------------------------------
  // red_o [NUM_WARPS][MAX_GROUP][HEAD_DIM + 4] fp32 (the +4 spreads a warp's stores over 32 banks),
  // red_m, red_l [NUM_WARPS][MAX_GROUP].
  constexpr int RED_ROW = HEAD_DIM + 4;
  static_assert((NUM_WARPS * MAX_GROUP * (RED_ROW + 2)) * 4 <= S::BYTES, "smem");
  float* const red_o = reinterpret_cast<float*>(smem_raw);
  float* const red_m = red_o + NUM_WARPS * MAX_GROUP * RED_ROW;
  float* const red_l = red_m + NUM_WARPS * MAX_GROUP;
  l += __shfl_xor_sync(0xffffffffu, l, 1);  // the quad's partial sums share one m
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (lane % 4 == 0) {
    red_m[warp * MAX_GROUP + lane / 4] = m;
    red_l[warp * MAX_GROUP + lane / 4] = l;
  }
  {
    float* const w_o = red_o + warp * MAX_GROUP * RED_ROW;
    // rows lane/4 and lane/4 + 8 of the O^T fragment: dims d0 and d1 (fp8: see the header)
    const int h0 = 2 * (lane % 4);
    const int d0 = FP8 ? 2 * (lane / 4) : lane / 4, d1 = FP8 ? d0 + 1 : d0 + 8;
#pragma unroll
    for (int s = 0; s < K_STEPS; ++s) {
      w_o[h0 * RED_ROW + 16 * s + d0] = o[s][0];
      w_o[(h0 + 1) * RED_ROW + 16 * s + d0] = o[s][1];
      w_o[h0 * RED_ROW + 16 * s + d1] = o[s][2];
      w_o[(h0 + 1) * RED_ROW + 16 * s + d1] = o[s][3];
    }
  }
  __syncthreads();

  // out / partial_out rows of the group: [.., kv_head * GROUP + g, ..]. A thread combines 4
  // consecutive dims of one head: the warps' weights once, float4 reads and one store. A
  // sequence of one partition is written whole: the merge skips it.
  const bool whole = max_num_partitions == 1 || seq_len <= partition_size;
  constexpr int CHUNKS = HEAD_DIM / 4;
  for (int idx = threadIdx.x; idx < GROUP * CHUNKS; idx += NUM_THREADS) {
    const int g = idx / CHUNKS, d = 4 * (idx % CHUNKS);
    float mw[NUM_WARPS], m_max = neg_inf();
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      mw[w] = red_m[w * MAX_GROUP + g];
      m_max = fmaxf(m_max, mw[w]);
    }
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      const float f = mw[w] == neg_inf() ? 0.f : fast_exp2(mw[w] - m_max);  // no tokens: 0
      sum += f * red_l[w * MAX_GROUP + g];
      const float4 ow =
          *reinterpret_cast<const float4*>(red_o + (w * MAX_GROUP + g) * RED_ROW + d);
      acc.x += f * ow.x; acc.y += f * ow.y; acc.z += f * ow.z; acc.w += f * ow.w;
    }
    const float norm = sum > 0.f ? out_scale / sum : 0.f;
    acc.x *= norm; acc.y *= norm; acc.z *= norm; acc.w *= norm;
    const long long head = static_cast<long long>(seq) * num_qo_heads + kv_head * GROUP + g;
    if (whole) {
      *reinterpret_cast<uint2*>(out + head * HEAD_DIM + d) =
          make_uint2(Mma<T>::pack(acc.x, acc.y), Mma<T>::pack(acc.z, acc.w));
    } else {
      *reinterpret_cast<float4*>(partial_out + (head * max_num_partitions + partition) * HEAD_DIM +
                                 d) = acc;
      if (d == 0)
        partial_lse[head * max_num_partitions + partition] =
            sum > 0.f ? (m_max + __log2f(sum)) * LN2 : neg_inf();
    }
  }
  timeline::stamp(tl::REGION, tl::END);
}

}  // namespace gqa

// ---- entry points (instantiated through CuPy name_expressions) ----------------------------

// out [num_seqs, num_qo_heads, HEAD_DIM] T (written when max_num_partitions == 1);
// partial_out [num_seqs, num_qo_heads, max_num_partitions, HEAD_DIM] fp32;
// partial_lse [num_seqs, num_qo_heads, max_num_partitions] fp32;
// q [num_seqs, num_qo_heads, HEAD_DIM] T; k_cache, v_cache [num_blocks, num_kv_heads, BLOCK_SIZE,
// HEAD_DIM] KV; k_scale, v_scale [num_kv_heads] float (fp8) or null; block_tables [num_seqs,
// max_num_blocks_per_seq] int32; seq_lens [num_seqs] int32; work null, or [num_items, 2] int32
// (sequence, partition) pairs, num_kv_heads CTAs each: grid (num_items * num_kv_heads, 1, 1).
// grid (max_num_partitions, num_kv_heads, num_seqs) without a work list, block 128,
// dynamic smem gqa::Smem<HEAD_DIM, sizeof(KV)>::BYTES.
// (__launch_bounds__ adds the shared-memory occupancy as min blocks; the launch is unchanged.)
template <typename T, typename KV, int HEAD_DIM, int BLOCK_SIZE, int GROUP, int PF_MODE, bool PF_K,
          bool PF_V, int PF_DIST, bool PF_EVICT_LAST, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, gqa::Smem<HEAD_DIM, sizeof(KV), WARPS>::CTAS_PER_SM)
    gqa_decode(
    T* __restrict__ out, float* __restrict__ partial_out, float* __restrict__ partial_lse,
    const T* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ work, int max_num_blocks_per_seq, int num_kv_heads,
    int partition_size, int max_num_partitions, float scale) {
#if __CUDA_ARCH__ >= 900
  // the merge (a programmatic dependent launch) may start now: it waits for this grid's results
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  gqa::decode_body<T, KV, HEAD_DIM, BLOCK_SIZE, GROUP, PF_MODE, PF_K, PF_V, PF_DIST,
                   PF_EVICT_LAST, WARPS>(
      out, partial_out, partial_lse, q, k_cache, v_cache, k_scale, v_scale, block_tables,
      seq_lens, work, max_num_blocks_per_seq, num_kv_heads, partition_size, max_num_partitions,
      scale);
}

// Combine the partitions of each (sequence, query head):
// out = sum_c w_c partial_out_c / sum_c w_c with w_c = exp(lse_c - max lse). Sequence s has
// ceil(seq_lens[s] / partition_size) partitions (at most max_num_partitions); one of one
// partition is left alone (gqa_decode wrote it).
// grid (num_qo_heads, num_merged), block 128, no dynamic shared memory: CTA (h, i) merges head h
// of sequence seqs[i], or of sequence i where seqs is null.
// The partial rows are read as float4: VECS = HEAD_DIM / 4 threads cover one partition's row, and
// the block reads ROWS = 128 / VECS partitions at a time: thread (slot, vec) sums dims
// 4 vec .. 4 vec + 3 over partitions slot, slot + ROWS, ..., weighted against the largest lse of
// those partitions only, so no reduction over the block precedes the sums. Each thread loads its
// first LOADS rows and their lse together (up to ROWS x LOADS partitions, 64 at head_dim 128, in
// one round trip from L2), and the ROWS partial sums meet in shared memory once, rescaled by
// their slots' largest lse.
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(128) gqa_merge(
    T* __restrict__ out, const float* __restrict__ partial_out,
    const float* __restrict__ partial_lse, const int* __restrict__ seq_lens,
    const int* __restrict__ seqs, int partition_size, int max_num_partitions) {
  constexpr int THREADS = 128;
  constexpr int VECS = HEAD_DIM / 4;      // float4 per partial row: 16 .. 64
  constexpr int ROWS = THREADS / VECS;    // partitions read at once: 2 .. 8
  namespace tl = timeline::merge;
  timeline::start(tl::REGION, tl::ENTRY);
  const int head = blockIdx.x, seq = seqs ? seqs[blockIdx.y] : blockIdx.y;
  const int num_qo_heads = gridDim.x;
  // gqa_decode does not write seq_lens: read it, and work out what to load, while the decode
  // grid still runs
  const int seq_len = seq_lens[seq];
  const int num_partitions =
      seq_len > 0 ? min((seq_len + partition_size - 1) / partition_size, max_num_partitions) : 0;
  const long long row = static_cast<long long>(seq) * num_qo_heads + head;
  const float* __restrict__ lse = partial_lse + row * max_num_partitions;  // [max_num_partitions]
  const float4* __restrict__ po =
      reinterpret_cast<const float4*>(partial_out + row * max_num_partitions * HEAD_DIM);

  constexpr int LOADS = 16;
  const int slot = threadIdx.x / VECS, vec = threadIdx.x % VECS;
  const bool reads = slot < ROWS;  // 128 % VECS threads idle for head_dim 80, 96, 112
  const int num_mine = reads ? (num_partitions - slot + ROWS - 1) / ROWS : 0;  // this slot's
  // gqa_decode wrote the out of a sequence of one partition itself: nothing to merge. CTA (0, 0)
  // still waits, so the merge grid ends after the decode grid whatever the lengths.
  const bool merges = num_partitions > 1;
  if (!merges && (blockIdx.x | blockIdx.y) != 0) return;
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of gqa_decode: wait until its partials are written.
  // The test on num_mine (never negative) keeps the work above ahead of the wait: without
  // one ptxas issues the wait first, and the seq_len round trip follows the decode grid's end.
  if (num_mine >= 0) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  timeline::stamp(tl::REGION, tl::RELEASED);
  if (!merges) return;
  // The partials are read with ld.global.cg (__ldcg), not through the read-only path that
  // `const __restrict__` allows: ptxas hoists read-only loads above the wait (seen with the work
  // above moved ahead of it), and they would read the partials before the decode grid wrote them.
  float4 first[LOADS];
  float first_lse[LOADS];
#pragma unroll
  for (int i = 0; i < LOADS; ++i) {
    const int c = slot + i * ROWS;
    first[i] = i < num_mine ? __ldcg(po + static_cast<long long>(c) * VECS + vec)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
    first_lse[i] = i < num_mine ? __ldcg(lse + c) : gqa::neg_inf();
  }
  float m = gqa::neg_inf();  // the largest lse of this slot's partitions
#pragma unroll
  for (int i = 0; i < LOADS; ++i) m = fmaxf(m, first_lse[i]);
  for (int i = LOADS; i < num_mine; ++i) m = fmaxf(m, __ldcg(lse + slot + i * ROWS));
  const float shift = m == gqa::neg_inf() ? 0.f : m;  // no partition: every weight is 0

  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float lse_c, float4 p) {
    const float w = __expf(lse_c - shift);
    sum += w;
    acc.x += w * p.x; acc.y += w * p.y; acc.z += w * p.z; acc.w += w * p.w;
  };
#pragma unroll
  for (int i = 0; i < LOADS; ++i) add(first_lse[i], first[i]);  // past num_mine: w = 0, p = 0
  timeline::stamp_after(tl::REGION, tl::LOADED, acc.x);
#pragma unroll 4
  for (int i = LOADS; i < num_mine; ++i) {
    const int c = slot + i * ROWS;
    add(__ldcg(lse + c), __ldcg(po + static_cast<long long>(c) * VECS + vec));
  }

  __shared__ float4 red[ROWS][VECS];
  __shared__ float red_m[ROWS], red_sum[ROWS];
  if (reads) {
    red[slot][vec] = acc;
    if (vec == 0) {
      red_m[slot] = m;
      red_sum[slot] = sum;
    }
  }
  __syncthreads();
  float m_max = gqa::neg_inf();
#pragma unroll
  for (int r = 0; r < ROWS; ++r) m_max = fmaxf(m_max, red_m[r]);
  float f[ROWS], weights = 0.f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    f[r] = red_m[r] == gqa::neg_inf() ? 0.f : __expf(red_m[r] - m_max);  // a slot with none: 0
    weights += f[r] * red_sum[r];
  }
  for (int d = threadIdx.x; d < HEAD_DIM; d += THREADS) {
    float value = 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) value += f[r] * reinterpret_cast<const float*>(red[r])[d];
    out[row * HEAD_DIM + d] = gqa::Mma<T>::from_float(weights > 0.f ? value / weights : 0.f);
  }
  timeline::stamp(tl::REGION, tl::END);
}

}  // namespace kvlab
