/* The planner of the course site (lessons/en/calculator.md, lessons/ru/calculator.md): fsdp_mini.course.planner
 * in the browser. It fills <div id="planner" data-lang="en|ru">.
 *
 * One source of truth for the numbers: every preset and constant (model shapes, GPU specifications, the three
 * fitted fractions, the named constants, the layout's defaults) comes from window.PLANNER_DATA, which
 * lessons/_site/planner_data.py writes into the page from fsdp_mini.course.planner_site.site_data() when the
 * site is built. What is here is the formulas, ported line for line from models.py, layout.py, activations.py,
 * memory.py, step_time.py and compare.py (and fsdp_mini.course.cost's rings), in the same order of floating-
 * point operations, so that the doubles are Python's to the last bit; the errors are Python's ValueErrors,
 * word for word (in Russian on the Russian page). Integers stay below 2**53, where a double is exact and
 * Python's int / int is the doubles' division. tests/site/test_site.py sets the inputs in Chromium and compares
 * every number and every error with Python's.
 */
(function (root) {
  "use strict";

  // --- Python's ways with numbers ----------------------------------------------------------------------
  function floorDiv(a, b) { return Math.floor(a / b); }  // a, b positive integers below 2**53
  function ceilDiv(a, b) { return -floorDiv(-a, b); }
  function pyRepr(v) {
    if (typeof v === "string") {
      var q = v.indexOf("'") >= 0 && v.indexOf('"') < 0 ? '"' : "'";
      return q + v.replace(/\\/g, "\\\\").replace(q === "'" ? /'/g : /"/g, "\\" + q) + q;
    }
    if (typeof v === "boolean") return v ? "True" : "False";
    return String(v);
  }
  // f"{x:.{d}f}": the exact binary value rounded half to even; toFixed rounds exact ties away from zero. A
  // double is halfway between two multiples of 10^-d exactly when x * 2^(d+1) is an odd integer.
  function pyFixed(x, d) {
    var q = Math.abs(x) * Math.pow(2, d + 1);
    if (Number.isSafeInteger(q) && q % 2 === 1) {
      var halves = BigInt(q) * 5n ** BigInt(d);  // x * 10^d * 2, an odd integer
      var n = (halves - 1n) / 2n;
      if (n % 2n === 1n) n += 1n;
      var s = n.toString().padStart(d + 1, "0");
      var text = d ? s.slice(0, s.length - d) + "." + s.slice(s.length - d) : s;
      return (x < 0 ? "-" : "") + text;
    }
    return x.toFixed(d);
  }

  // --- fsdp_mini.course.cost: the rings --------------------------------------------------------------
  function ringSteps(op, n) { return op === "all_reduce" ? 2 * (n - 1) : n - 1; }
  function ring(op, nbytes, n, alpha, bandwidth) {
    return ringSteps(op, n) * alpha + ringSteps(op, n) / n * nbytes / bandwidth;
  }
  function ringAllReduce(s, n, a, b) { return ring("all_reduce", s, n, a, b); }
  function ringReduceScatter(s, n, a, b) { return ring("reduce_scatter", s, n, a, b); }
  function ringAllGather(s, n, a, b) { return ringReduceScatter(s, n, a, b); }

  // --- errors: a ValueError's message, and the same in Russian ------------------------------------------
  function PlanError(key, values) { this.key = key; this.values = values; }
  function fail(key, values) { throw new PlanError(key, values); }

  function makePlanner(D) {
    var C = D.constants, CK = D.checkpointing;  // checkpointing: none, selective-op, selective-layer, full
    var NONE = CK[0], SELECTIVE_OP = CK[1], SELECTIVE_LAYER = CK[2], FULL = CK[3];

    // --- models.py: ModelSpec ----------------------------------------------------------------------------
    function modelSpec(m) {
      ["hidden", "layers", "heads", "kv_heads", "ffn", "vocab"].forEach(function (field) {
        var value = m[field];
        if (typeof value !== "number" || !Number.isInteger(value) || value < 1) {
          fail("field_int", {field: field, value: pyRepr(value)});
        }
      });
      if (m.hidden % m.heads) fail("heads_hidden", {heads: m.heads, hidden: m.hidden});
      if (m.heads % m.kv_heads) fail("kv_heads", {kv_heads: m.kv_heads, heads: m.heads});
      if (m.positions < 0) fail("positions", {value: pyRepr(m.positions)});
      var s = Object.assign({}, m);
      var h = s.hidden, f = s.ffn;
      s.head_dim = floorDiv(h, s.heads);
      s.kv_dim = s.kv_heads * s.head_dim;
      var kv = s.kv_dim;
      s.block_matmuls = s.mlp === "swiglu"
        ? [["wq", h * h], ["wk", h * kv], ["wv", h * kv], ["wo", h * h], ["w1", h * f], ["w3", h * f], ["w2", f * h]]
        : [["qkv", h * (h + 2 * kv)], ["proj", h * h], ["fc", h * f], ["fc_proj", f * h]];
      s.matmul_params = s.block_matmuls.reduce(function (a, x) { return a + x[1]; }, 0);
      s.bias_params = !s.bias ? 0 : s.mlp === "swiglu" ? 2 * h + 2 * kv + 2 * f + h : (h + 2 * kv) + h + f + h;
      s.norm_params = h * (s.norm === "layernorm" ? 2 : 1);
      s.block_params = s.matmul_params + s.bias_params + 2 * s.norm_params;
      s.root_params = s.vocab * h * (s.tied ? 1 : 2) + s.positions * h + s.norm_params;
      s.params = s.layers * s.block_params + s.root_params;
      return s;
    }
    function checkTp(model, tp) {
      [["heads", model.heads], ["kv_heads", model.kv_heads], ["ffn", model.ffn]].forEach(function (w) {
        if (w[1] % tp) fail("tp_model", {tp: tp, model: model.name, what: w[0], value: w[1]});
      });
    }

    // --- layout.py: Layout -------------------------------------------------------------------------------
    function layout(fields) {
      var l = Object.assign({}, D.layout_defaults, fields);
      ["gpus", "seq", "local_batch", "gpus_per_node", "dp_replicate", "tp", "cp", "micro_batches", "ac_every"]
        .forEach(function (name) {
          var v = l[name];
          if (typeof v !== "number" || !Number.isInteger(v) || v < 1) {
            fail("positive", {name: "--" + name.replace(/_/g, "-"), value: pyRepr(v)});
          }
        });
      var inner = l.dp_replicate * l.tp * l.cp;
      if (l.gpus % inner) fail("gpus_inner", {gpus: l.gpus, r: l.dp_replicate, tp: l.tp, cp: l.cp, inner: inner});
      if (l.gpus > l.gpus_per_node && l.gpus % l.gpus_per_node) fail("gpus_nodes", {gpus: l.gpus, gpn: l.gpus_per_node});
      if (D.sp_variants.indexOf(l.sp_variant) < 0) fail("sp_variant", {v: pyRepr(l.sp_variant), all: D.sp_variants.join(", ")});
      if (l.sp && l.tp === 1) fail("sp_tp", {});
      if (l.seq % l.cp) fail("cp_seq", {cp: l.cp, seq: l.seq});
      if (l.cp > 1 && l.seq % (2 * l.cp)) fail("seq_chunks", {seq: l.seq, chunks: 2 * l.cp});
      if (l.tp_overlap && l.tp === 1) fail("tp_overlap", {});
      if (l.no_sync && l.micro_batches === 1) fail("no_sync", {});
      if (l.local_batch % l.micro_batches) fail("micro", {m: l.micro_batches, b: l.local_batch});
      if (l.sp && floorDiv(l.seq, l.cp) % l.tp) fail("sp_tokens", {tp: l.tp, tokens: floorDiv(l.seq, l.cp)});
      l.dp_shard = floorDiv(l.gpus, l.dp_replicate * l.tp * l.cp);
      l.fsdp_group = l.dp_shard * l.cp;
      l.dp = l.dp_replicate * l.dp_shard;
      l.micro_batch = floorDiv(l.local_batch, l.micro_batches);
      l.tokens_per_step = l.dp * l.local_batch * l.seq;
      l.tokens_per_gpu = floorDiv(l.micro_batch * l.seq, l.cp);
      return l;
    }
    function check(l, model, gpu) {
      checkTp(model, l.tp);
      if (l.float8 && gpu.fp8_flops === null) fail("float8", {gpu: gpu.name});
      if (l.tp > l.gpus_per_node) fail("tp_node", {tp: l.tp, gpn: l.gpus_per_node});
    }

    // --- activations.py ----------------------------------------------------------------------------------
    // a saved tensor: [bytes per token, split]; split "tp", "sp", "gathered", "full" or "sp-only"
    function normSaved(model, e, compile) {
      var h = model.hidden, inner;
      if (model.norm === "layernorm") inner = [[e * h, "sp"], [8, "sp"]];
      else if (compile) inner = [[e * h, "sp"], [4, "sp"]];
      else inner = [[4 * h, "sp"], [4, "sp"], [e * h, "sp"]];
      return inner.concat([[e * h, "gathered"]]);
    }
    function attentionSaved(model, e) {
      var h = model.hidden;
      var qkv = model.mlp === "gelu" ? [[e * (h + 2 * model.kv_dim), "tp"]] : [[e * h, "tp"], [e * h, "tp"], [e * h, "tp"]];
      return qkv.concat([[e * h, "tp"], [4 * model.heads, "tp"]]);
    }
    function mlpSaved(model, e, compile) {
      var f = model.ffn;
      if (model.mlp === "gelu") return compile ? [[e * f, "tp"]] : [[e * f, "tp"], [e * f, "tp"]];
      if (compile) return [[e * f, "tp"], [e * f, "tp"]];
      return [[e * f, "tp"], [e * f, "tp"], [e * f, "tp"], [e * f, "tp"]];
    }
    function matmulOutputs(model) {
      var h = model.hidden, kv = model.kv_dim, f = model.ffn;
      if (model.mlp === "swiglu") {
        return [["wq", h, "tp"], ["wk", kv, "tp"], ["wv", kv, "tp"], ["wo", h, "full"],
                ["w1", f, "tp"], ["w3", f, "tp"], ["w2", h, "full"]];
      }
      return [["qkv", h + 2 * kv, "tp"], ["proj", h, "full"], ["fc", f, "tp"], ["fc_proj", h, "full"]];
    }
    function columnParallelWidths(model) {  // runs of TP-split outputs that read one input
      var widths = [], run = 0;
      matmulOutputs(model).forEach(function (mm) {
        if (mm[2] === "tp") run += mm[1];
        else if (run) { widths.push(run); run = 0; }
      });
      return run ? widths.concat([run]) : widths;
    }
    function recomputedMatmuls(model) {
      return matmulOutputs(model).filter(function (_, i) { return (i + 1) % 2 === 0; }).map(function (x) { return x[0]; });
    }
    function blockSaved(model, mode, e, compile) {
      var blockInput = [e * model.hidden, "sp"];
      if (mode === FULL || mode === SELECTIVE_LAYER) return [blockInput];
      if (mode === SELECTIVE_OP) {
        var recomputed = recomputedMatmuls(model);
        var mms = matmulOutputs(model).filter(function (x) { return recomputed.indexOf(x[0]) < 0; })
          .map(function (x) { return [e * x[1], x[2]]; });
        return [blockInput].concat(mms, [[e * model.hidden, "tp"], [4 * model.heads, "tp"], [2 * e * model.hidden, "sp-only"]]);
      }
      return normSaved(model, e, compile).concat(attentionSaved(model, e), normSaved(model, e, compile), mlpSaved(model, e, compile));
    }
    function checkpointedBlocks(layers, mode, every) {
      if (mode === NONE) return 0;
      if (mode === SELECTIVE_LAYER) return floorDiv(layers, every);
      return layers;
    }
    function lossBytesPerToken(model, e, compile, vocabParallel) {
      if (compile) return model.vocab * 2 * e;
      var backward = (vocabParallel ? 4 : 3) * C.LOSS_FP32;
      return model.vocab * Math.max(e + 2 * C.LOSS_FP32, backward);
    }

    // --- memory.py -----------------------------------------------------------------------------------------
    function savedBytes(items, l, tokens) {
      var total = 0.0;
      items.forEach(function (item) {
        if (item[1] === "sp-only" && !l.sp) return;
        var split = item[1] === "tp" || item[1] === "sp-only" || (item[1] === "sp" && l.sp) ||
          (item[1] === "gathered" && l.sp && l.sp_variant === "megatron") ? l.tp : 1;
        total += item[0] * tokens / split;
      });
      return total;
    }
    function memoryBreakdown(model, gpu, l) {
      check(l, model, gpu);
      var tp = l.tp, group = l.fsdp_group;
      var shard = ceilDiv(model.params, tp * group);
      var states = Object.keys(C.STATE_BYTES).map(function (name) { return l.cpu_offload ? 0.0 : shard * C.STATE_BYTES[name]; });
      var unit = model.block_params / tp;
      var gatheredBytes = l.float8 ? 1 : 2;
      var rootBytes = 2 * model.root_params / tp;
      var tokens = l.tokens_per_gpu, e = 2;
      var perBlock = {};
      CK.forEach(function (mode) { perBlock[mode] = savedBytes(blockSaved(model, mode, e, l.compile), l, tokens); });
      var nCkpt = checkpointedBlocks(model.layers, l.ac, l.ac_every);
      var blocks = l.ac === SELECTIVE_LAYER
        ? nCkpt * perBlock[FULL] + (model.layers - nCkpt) * perBlock[NONE]
        : model.layers * perBlock[l.ac];
      var finalNorm = savedBytes(normSaved(model, e, l.compile), l, tokens);
      var rebuilt = nCkpt ? perBlock[NONE] : 0.0;
      var loss = lossBytesPerToken(model, e, l.compile_loss, tp > 1) * tokens / tp;
      var inFlight = (1 + l.prefetch) * unit * gatheredBytes;
      var backwardBuffers = unit * 2 + unit * 4 + rootBytes;
      var kept = unit * gatheredBytes * (l.reshard_after_forward ? 1 : model.layers);
      var forwardEnd = loss + kept;
      var lastCheckpointed = l.ac !== SELECTIVE_LAYER || model.layers % l.ac_every === 0;
      var lastSaved = perBlock[l.ac !== SELECTIVE_LAYER ? l.ac : (lastCheckpointed ? FULL : NONE)];
      var backwardStart = Math.max(inFlight, kept) + rootBytes + Math.max(rebuilt, unit * 6 - lastSaved);
      var accumulated = l.no_sync ? 4 * model.params / tp : 0.0;  // FSDP2 without gradient sync: unsharded fp32 grads
      var values = states.concat([rootBytes, blocks, finalNorm, Math.max(inFlight, kept), backwardBuffers, rebuilt, loss,
                                  accumulated]);
      var base = states.reduce(function (a, x) { return a + x; }, 0) + rootBytes + blocks + finalNorm + accumulated;
      var atForwardEnd = forwardEnd >= backwardStart;
      var peak = base + (atForwardEnd ? forwardEnd : backwardStart);
      var reserved = peak * C.ALLOCATOR_OVERHEAD;
      return {values: values, peak_allocated: peak, peak_reserved: reserved, capacity: gpu.memory_bytes,
              moment: atForwardEnd ? "forward" : "backward", fits: reserved <= gpu.memory_bytes,
              short_by: Math.max(0.0, reserved - gpu.memory_bytes),
              // MemoryBreakdown.likely_peak and .fit_verdict: where published runs' errors put the measured peak
              likely: [reserved / (1 + C.MEMORY_ERROR_BAND[1]), reserved / (1 + C.MEMORY_ERROR_BAND[0])],
              // the peak's parts, for the bar: states, the root unit, activations, what the peak's moment adds
              bar: {states: states, root: rootBytes, activations: blocks + finalNorm,
                    moment: atForwardEnd ? forwardEnd : backwardStart,
                    moment_parts: atForwardEnd ? {loss: loss, gathered: kept}
                      : {gathered: Math.max(inFlight, kept), root_grad: rootBytes, block: Math.max(rebuilt, unit * 6 - lastSaved)}}};
    }

    // --- step_time.py -----------------------------------------------------------------------------------
    function elementwiseBytes(model, compile) {
      var h = model.hidden, kv = model.kv_dim, f = model.ffn;
      var rope = model.positions === 0;
      var repeat = kv < h ? 4 * (kv + h) : 0;
      var stream, inner;
      if (compile) {
        stream = 2 * 8 * h;
        inner = (rope ? 20 * (h + kv) : 0) + repeat + (model.mlp === "swiglu" ? 6 * f : 4 * f);
      } else {
        var norm = model.norm === "rmsnorm" ? 36 * h : 4 * h;
        stream = 2 * norm + 2 * 6 * h;
        inner = (rope ? 20 * (h + kv) : 0) + repeat + (model.mlp === "swiglu" ? 10 * f : 4 * f);
      }
      return [stream, inner];
    }
    function groupLink(size, stride, gpu, gpusPerNode, networkFraction) {
      if (size * stride <= gpusPerNode) return [gpu.alpha_nvlink, gpu.nvlink_bandwidth];
      var perNode = Math.max(1, floorDiv(gpusPerNode, stride));
      return [gpu.alpha_network, Math.min(gpu.nvlink_bandwidth, perNode * gpu.network_bandwidth * networkFraction)];
    }
    function gpuAttentionPeak(gpu) { return gpu.attention_flops === null ? gpu.bf16_flops : gpu.attention_flops; }
    function flopsPerToken(model, seq) { return 6 * model.params + 12 * model.layers * model.hidden * seq; }
    function mfu(model, gpu, seq, rate) { return rate * flopsPerToken(model, seq) / gpu.bf16_flops; }

    function stepTime(model, gpu, l) {
      check(l, model, gpu);
      var c = D.calibration, R = C.ATTENTION_BACKWARD_RATIO;
      var tp = l.tp, cp = l.cp, T = l.tokens_per_gpu, L = model.layers;
      var mmPeak = (l.float8 ? gpu.fp8_flops : gpu.bf16_flops) * c.matmul_fraction;
      var attnPeak = gpuAttentionPeak(gpu) * c.matmul_fraction;
      var hbm = gpu.hbm_bandwidth * c.hbm_fraction;
      var spSplit = l.sp ? tp : 1;

      var mmF = 2 * model.matmul_params / tp * T / mmPeak;
      var attnF = 2 * l.seq * model.hidden * T / tp / attnPeak;
      var eb = elementwiseBytes(model, l.compile), stream = eb[0], inner = eb[1];
      var elemBytes = stream * T / spSplit + inner * T / tp;
      if (l.float8) {
        var outs = matmulOutputs(model);
        var widths = model.block_matmuls.map(function (mm, i) { return [floorDiv(mm[1], outs[i][1]), outs[i][1]]; });
        elemBytes += 3 * widths.reduce(function (a, w) { return a + (w[0] + w[1]); }, 0) * T / tp;
      }
      var elemF = elemBytes / hbm;
      var outputs = {};
      matmulOutputs(model).forEach(function (x) { outputs[x[0]] = x[1]; });
      var recomputedMm = 2 * model.hidden * recomputedMatmuls(model).reduce(function (a, n) { return a + outputs[n]; }, 0)
        / tp * T / mmPeak;

      var actBytes = 2 * T * model.hidden;
      var tl = groupLink(tp, 1, gpu, l.gpus_per_node, c.network_fraction);
      var tpF, tpB, tpRecomputed;
      if (tp === 1) {
        tpF = tpB = tpRecomputed = 0.0;
      } else if (l.sp) {
        var gather = 2 * ringAllGather(actBytes, tp, tl[0], tl[1]);
        tpF = tpB = gather + 2 * ringReduceScatter(actBytes, tp, tl[0], tl[1]);
        if (l.sp_variant === "megatron") tpB += gather;
        tpRecomputed = gather;
      } else {
        tpF = tpB = tpRecomputed = 2 * ringAllReduce(actBytes, tp, tl[0], tl[1]);
      }
      if (l.tp_overlap) {  // per column-parallel layer: its backward collectives beside its weight-gradient product
        var beside;
        if (l.sp) {
          beside = ringReduceScatter(actBytes, tp, tl[0], tl[1]) +
            (l.sp_variant === "megatron" ? ringAllGather(actBytes, tp, tl[0], tl[1]) : 0.0);
        } else {
          beside = ringAllReduce(actBytes, tp, tl[0], tl[1]);
        }
        tpB -= columnParallelWidths(model).reduce(function (a, w) {
          return a + Math.min(beside, 2 * model.hidden * w / tp * T / mmPeak);
        }, 0);
      }
      var cl = groupLink(cp, tp, gpu, l.gpus_per_node, c.network_fraction);
      var kvChunk = 2 * 2 * T * model.kv_dim / tp;
      var cpRingF = cp > 1 ? (cp - 1) * (cl[0] + kvChunk / cl[1]) : 0.0;
      var cpF = Math.max(0.0, cpRingF - attnF * (cp - 1) / cp);
      var cpB = Math.max(0.0, 2 * cpRingF - R * attnF * (cp - 1) / cp);

      var forward = mmF + attnF + elemF + tpF + cpF;
      var backward = 2 * mmF + R * attnF + 2 * elemF + tpB + cpB;
      var nCkpt = checkpointedBlocks(L, l.ac, l.ac_every);
      var recompute;
      if (l.ac === SELECTIVE_OP) recompute = recomputedMm + elemF + tpRecomputed;
      else if (nCkpt) recompute = forward;
      else recompute = 0.0;
      var recomputeShare = nCkpt / L;

      var headF = 2 * model.vocab * model.hidden / tp * T / mmPeak;
      var lossBytes = l.compile_loss ? C.COMPILED_LOSS_BYTES_PER_LOGIT : C.LOSS_BYTES_PER_LOGIT;
      var loss = (lossBytes * model.vocab / tp * T + 3 * stream / 2 * T / spSplit) / hbm;

      var n = l.fsdp_group;
      var fl = groupLink(n, tp, gpu, l.gpus_per_node, c.network_fraction);
      var unit = model.block_params / tp;
      var gatherBytes = l.float8 ? 1 : 2;
      var ag = n > 1 ? ringAllGather(unit * gatherBytes, n, fl[0], fl[1]) : 0.0;
      var rs = n > 1 ? ringReduceScatter(unit * 4, n, fl[0], fl[1]) : 0.0;
      var rootP = model.root_params / tp;
      var agRoot = n > 1 ? ringAllGather(rootP * 2, n, fl[0], fl[1]) : 0.0;
      var rsRoot = n > 1 ? ringReduceScatter(rootP * 4, n, fl[0], fl[1]) : 0.0;
      var r = l.dp_replicate;
      var rl = groupLink(r, n * tp, gpu, l.gpus_per_node, c.network_fraction);
      var ar = r > 1 ? ringAllReduce(unit / n * 4, r, rl[0], rl[1]) : 0.0;
      var arRoot = r > 1 ? ringAllReduce(rootP / n * 4, r, rl[0], rl[1]) : 0.0;

      // FSDP2's copy-out after each AllGather, copy-in before each ReduceScatter
      var copyOut = C.FSDP_COPY_BYTES_PER_PARAM[0], copyIn = C.FSDP_COPY_BYTES_PER_PARAM[1];
      copyOut = copyOut * gatherBytes / 2;
      var fsdpCopies = n > 1 ? unit * (copyOut * (l.reshard_after_forward ? 2 : 1) + copyIn) / hbm : 0.0;

      var blockBackward = backward + recompute * recomputeShare;
      var hides = l.prefetch > 0;
      var fwdExposed = agRoot + ag + (L - 1) * (hides ? Math.max(0.0, ag - forward) : ag);
      var agBackward = l.reshard_after_forward ? ag : 0.0;  // the backward's AllGather (none if kept gathered)
      var bwdComm = agBackward + rs + ar;
      var bwdExposed = (L - 1) * (hides ? Math.max(0.0, bwdComm - blockBackward) : bwdComm) + rs + ar + rsRoot + arRoot;
      var compute = L * (forward + blockBackward + fsdpCopies) + 3 * headF + loss;
      var micro = compute + fwdExposed + bwdExposed;
      // a micro-batch without gradient sync: no ReduceScatter
      var noSyncExposed = (L - 1) * (hides ? Math.max(0.0, agBackward - blockBackward) : agBackward);

      var localParams = model.params / (tp * n);
      var optimizer = localParams * C.OPTIMIZER_BYTES_PER_PARAM / hbm;
      // CPU offload has no input on the page (nor a CLI flag): the Python planner prices it (cpu_offload_time)
      if (l.cpu_offload) throw new Error("CPU offload is priced by fsdp_mini.course.planner only");
      var m = l.micro_batches;
      var unsynced = l.no_sync ? m - 1 : 0;
      var savedByNoSync = unsynced * (noSyncExposed - bwdExposed);
      var step = m * micro + savedByNoSync + optimizer;
      var tokensPerGpu = l.tokens_per_step / l.gpus;
      var rate = tokensPerGpu / step;
      var parts = [
        m * (L * 3 * mmF + 3 * headF),
        m * L * (1 + R) * attnF,
        m * (L * 3 * elemF + loss),
        m * L * fsdpCopies,
        m * L * recompute * recomputeShare,
        m * L * (tpF + tpB),
        m * L * (cpF + cpB),
        m * fwdExposed,
        m * bwdExposed + savedByNoSync,
        optimizer,
      ];
      return {step_s: step, tokens_per_s_per_gpu: rate, mfu: mfu(model, gpu, l.seq, rate), parts: parts,
              // one micro-batch in the order it runs, for the timeline: GPU work and FSDP's collectives beside it
              timeline: {micro_batches: m, optimizer: optimizer, fwd_wait: fwdExposed, bwd_wait: bwdExposed,
                         forward: [L * mmF, L * attnF, L * elemF, L * tpF, L * cpF],
                         head: [3 * headF, loss],
                         backward: [L * 2 * mmF, L * R * attnF, L * 2 * elemF, L * tpB, L * cpB,
                                    L * recompute * recomputeShare, L * fsdpCopies],
                         gathers: agRoot + L * ag, reductions: L * (rs + ar) + rsRoot + arRoot}};
    }

    // --- __init__.py: plan ------------------------------------------------------------------------------
    function plan(model, gpu, l) {
      return {model: model, gpu: gpu, layout: l, memory: memoryBreakdown(model, gpu, l), time: stepTime(model, gpu, l)};
    }
    function getGpu(name) { return Object.assign({name: name}, D.gpus[name]); }
    function getModel(name) { return modelSpec(Object.assign({}, D.models[name], {name: name})); }

    // --- compare.py ---------------------------------------------------------------------------------------
    // MemoryBreakdown.fit_verdict: fits at both ends of the memory error band, does not fit at neither
    function verdictOf(m) {
      return m.likely[1] <= m.capacity ? C.VERDICTS[0] : m.likely[0] > m.capacity ? C.VERDICTS[2] : C.VERDICTS[1];
    }
    function describe(l) {
      var parts = ["FSDP " + l.dp_shard];
      if (l.dp_replicate > 1) parts.unshift("HSDP " + l.dp_replicate + "x");
      if (l.tp > 1) parts.push("TP " + l.tp + (l.sp ? (l.sp_variant === "megatron" ? "+SP (Megatron)" : "+SP") : "") +
                               (l.tp_overlap ? " overlapped" : ""));
      if (l.cp > 1) parts.push("CP " + l.cp);
      var micro = l.micro_batches > 1 ? " in " + l.micro_batches + " micro-batches" : "";
      if (l.no_sync) micro += " (sync the last)";
      return parts.join(" ") + ", batch " + l.local_batch + micro + ", AC " + l.ac;
    }
    function candidates(model, l) {
      var sequences = l.local_batch * l.dp;
      var nodes = Math.max(1, floorDiv(l.gpus, l.gpus_per_node));
      var out = [];
      for (var replicate = 1; replicate <= nodes; replicate++) {
        if (nodes % replicate) continue;
        [1, 2, 4, 8].forEach(function (tp) {
          (tp > 1 ? [false, true] : [false]).forEach(function (sp) {
            [1, 2, 4, 8].forEach(function (cp) {
              CK.forEach(function (ac) {
                if (l.gpus % (replicate * tp * cp) || tp > l.gpus_per_node) return;
                var dp = floorDiv(l.gpus, tp * cp);
                if (sequences % dp) return;
                var local = floorDiv(sequences, dp);
                for (var micro = 1; micro <= local; micro++) {  // every number of micro-batches that divides it
                  if (local % micro) continue;
                  (micro > 1 ? [false, true] : [false]).forEach(function (noSync) {
                    (tp > 1 ? [false, true] : [false]).forEach(function (overlap) {
                      try {
                        var c = layout(Object.assign({}, l, {dp_replicate: replicate, tp: tp, sp: sp, cp: cp, ac: ac,
                                                             local_batch: local, micro_batches: micro, no_sync: noSync,
                                                             tp_overlap: overlap}));
                        checkTp(model, tp);
                        out.push(c);
                      } catch (e) {
                        if (!(e instanceof PlanError)) throw e;
                      }
                    });
                  });
                }
              });
            });
          });
        });
      }
      return out;
    }
    function why(loser, winner) {
      if (!loser.memory.fits) return {key: "short", value: loser.memory.short_by / C.GiB};
      if (verdictOf(loser.memory) === C.VERDICTS[2]) return {key: "within_error"};
      if (verdictOf(loser.memory) === C.VERDICTS[1]) return {key: "undecided"};
      if (loser.time.tokens_per_s_per_gpu >= 0.995 * winner.time.tokens_per_s_per_gpu) return {key: "as_fast"};
      var best = -1, seconds = -Infinity;
      loser.time.parts.forEach(function (s, i) {
        var extra = s - winner.time.parts[i];
        if (extra > seconds) { best = i; seconds = extra; }
      });
      return {key: "part", part: best, share: seconds / loser.time.step_s * 100};
    }
    function compare(model, gpu, l) {
      check(l, model, gpu);
      var plans = [];
      candidates(model, l).forEach(function (c) {
        try { plans.push(plan(model, gpu, c)); } catch (e) { if (!(e instanceof PlanError)) throw e; }
      });
      var surely = {}; surely[C.VERDICTS[0]] = 0; surely[C.VERDICTS[1]] = 1;  // Python's compare: fits, then undecided
      var fitting = plans.filter(function (p) { return verdictOf(p.memory) in surely; })
        .sort(function (a, b) {
          return surely[verdictOf(a.memory)] - surely[verdictOf(b.memory)] ||
                 b.time.tokens_per_s_per_gpu - a.time.tokens_per_s_per_gpu; });
      var short = plans.filter(function (p) { return !(verdictOf(p.memory) in surely); })
        .sort(function (a, b) { return a.memory.short_by - b.memory.short_by || a.memory.likely[0] - b.memory.likely[0]; });
      return fitting.map(function (p, i) { return {plan: p, rank: i + 1, why: i === 0 ? {key: "fastest"} : why(p, fitting[0])}; })
        .concat(short.map(function (p) { return {plan: p, rank: null, why: why(p, fitting.length ? fitting[0] : p)}; }));
    }

    // --- Plan.to_dict(): what `python -m fsdp_mini plan --json` prints, keys and all ------------------------
    var MEMORY_TERMS = Object.keys(C.STATE_BYTES).concat([
      "root unit gathered (bf16)", "activations: blocks", "activations: final norm", "blocks gathered in flight (bf16)",
      "gradient buffers (block bf16 + fp32 for ReduceScatter, root bf16)", "checkpointed block rebuilt in backward",
      "logits and loss (bf16 logits, fp32 copy, log_softmax)", "unsharded gradients accumulated (no sync, fp32)"]);
    var NO_SYNC_TERM = MEMORY_TERMS[MEMORY_TERMS.length - 1];
    var STEP_PARTS = ["matmuls (blocks and head)", "attention", "memory-bound ops (norms, rotary, SwiGLU, loss)",
      "FSDP copy-in / copy-out", "recomputation", "TP collectives (exposed)", "CP ring (exposed)", "FSDP AllGather (exposed)",
      "FSDP ReduceScatter / HSDP AllReduce (exposed)", "optimizer step"];
    var MOMENTS = {forward: "end of forward (the loss)", backward: "start of backward"};
    function toDict(p) {
      var l = p.layout, m = p.memory, t = p.time, memory = {}, parts = {};
      MEMORY_TERMS.forEach(function (k, i) {
        if (k !== NO_SYNC_TERM || l.no_sync) memory[k] = m.values[i] / C.GiB;  // as Python: only where it exists
      });
      STEP_PARTS.forEach(function (k, i) { parts[k] = t.parts[i]; });
      return {
        model: p.model.name, gpu: p.gpu.name, params: p.model.params,
        layout: {gpus: l.gpus, gpus_per_node: l.gpus_per_node, dp_replicate: l.dp_replicate, dp_shard: l.dp_shard,
                 tp: l.tp, sp: l.sp, sp_variant: l.sp_variant, cp: l.cp, seq: l.seq, local_batch: l.local_batch,
                 micro_batches: l.micro_batches,
                 ac: l.ac, float8: l.float8, compile: l.compile, compile_loss: l.compile_loss, no_sync: l.no_sync,
                 tp_overlap: l.tp_overlap},
        memory_gib: m.peak_reserved / C.GiB, memory_allocated_gib: m.peak_allocated / C.GiB,
        memory_capacity_gib: m.capacity / C.GiB, memory: memory, memory_peak_moment: MOMENTS[m.moment],
        fits: m.fits, verdict: verdictOf(m),
        memory_band_gib: [m.likely[0] / C.GiB, m.likely[1] / C.GiB],
        short_by_gib: m.short_by / C.GiB, step_s: t.step_s, step_parts_s: parts,
        tokens_per_s_per_gpu: t.tokens_per_s_per_gpu, mfu: t.mfu,
      };
    }

    return {MEMORY_TERMS: MEMORY_TERMS, STEP_PARTS: STEP_PARTS, toDict: toDict, modelSpec: modelSpec, layout: layout, check: check, plan: plan, compare: compare, describe: describe,
            getGpu: getGpu, getModel: getModel, PlanError: PlanError};
  }

  var api = {makePlanner: makePlanner, pyFixed: pyFixed, pyRepr: pyRepr, PlanError: PlanError};
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.plannerCore = api;
})(typeof window !== "undefined" ? window : this);
