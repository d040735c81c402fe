/* The planner's page (lessons/en/calculator.md, lessons/ru/calculator.md): the CLI's inputs above; below, the
 * verdict, the memory per GPU as a bar and a table, one step as a timeline and a table, and every layout ranked.
 *
 * The numbers are planner.js's (fsdp_mini.course.planner, ported) on window.PLANNER_DATA (written into the
 * page at build time from fsdp_mini.course.planner_site). Numbers print as fsdp_mini.course.language.num
 * prints them: 49,152 and 1.5 in English, 49 152 and 1,5 in Russian. Errors are the ValueErrors of Python's
 * `python -m fsdp_mini plan` word for word, and their Russian translations on the Russian page.
 */
(function () {
  "use strict";
  var core = window.plannerCore, D = window.PLANNER_DATA;
  if (!core || !D) return;
  var P = core.makePlanner(D);
  var pyFixed = core.pyFixed;

  var TEXT = {
    en: {
      model: "Model (--model)", custom: "custom shapes…", family: "Family", llama: "Llama (SwiGLU, RMSNorm, rotary)",
      gpt2: "GPT-2 (GELU, LayerNorm, learned positions, tied head)", gpu: "GPU (--gpu)",
      hidden: "hidden", layers: "layers", heads: "heads", kv_heads: "kv_heads", ffn: "ffn", vocab: "vocab",
      gpus: "GPUs in all (--gpus)", gpus_per_node: "GPUs per node (--gpus-per-node)",
      dp_replicate: "HSDP replicas (--dp-replicate)", tp: "Tensor parallel (--tp)", sp: "sequence parallelism (--sp)",
      cp: "Context parallel (--cp)", seq: "Sequence length (--seq)", local_batch: "Sequences per data-parallel rank (--local-batch)",
      micro_batches: "Micro-batches (--micro-batches)", ac: "Activation checkpointing (--ac)",
      float8: "float8 linears (--float8)", compile: "torch.compile (--compile)",
      compile_loss: "the loss compiled too (--compile-loss)",
      reset: "torchtitan's published run", params: "parameters",
      headline: "{model} ({params} {params_word}) on {gpus} × {gpu}: {layout}, {batch} × {seq} tokens per data-parallel rank, AC {ac}",
      fits: "Fits: {peak} of {capacity} GiB per GPU ({free} GiB free); published runs' peaks put it at {low}–{high} GiB.",
      undecided: "Undecided: {peak} of {capacity} GiB per GPU by the count, but published runs' peaks put it at {low}–{high} GiB: measure it first.",
      short: "Does not fit: {peak} of {capacity} GiB per GPU ({short} GiB short by the count); published runs' peaks put it at {low}–{high} GiB.",
      rate: "{rate} {tokens}/s per GPU, MFU {mfu}%, {step} s per step.",
      published: "Published for this run (torchtitan, docs/performance.md): {rate} {tokens}/s per GPU, MFU {mfu}%.",
      memory: "Memory per GPU at its peak", memory_table: "Every term", gib: "GiB", s: "s",
      capacity: "capacity {x} GiB", states: "model states (fp32 parameters, gradients, AdamW moments)",
      root: "root unit gathered", activations: "activations", loss: "logits and loss", gathered: "blocks gathered",
      root_grad: "root's gradient", block: "block in backward (rebuilt forward or gradient buffers)",
      reserve: "allocator's reserve", peak_allocated: "peak allocated", peak_reserved: "peak reserved (torch.cuda.max_memory_reserved)",
      moment: {forward: "end of forward (the loss)", backward: "start of backward"},
      timeline: "One step, in time", time_table: "Where the step's time goes",
      lane_gpu: "GPU", lane_nccl: "FSDP collectives", step: "step",
      seg: {mm: "matrix products", attn: "attention", elem: "memory-bound ops", tp: "TP collectives", cp: "CP ring",
            recompute: "recomputation", copies: "FSDP's copy-in / copy-out", head: "output head and loss", wait_ag: "waiting for AllGather",
            wait_rs: "waiting for ReduceScatter / AllReduce", optimizer: "optimizer step",
            ag: "AllGathers (hidden behind forward where short enough)", rs: "ReduceScatters / HSDP AllReduces"},
      ranking: "Every layout of these GPUs and this global batch ({n} {sequences}), fastest first",
      rank: "rank", layout: "layout", mem: "GiB", tok: "tokens/s/GPU", mfu: "MFU", why: "why not first",
      more: "all {n} layouts", cli: "The same numbers in Python:", apply: "use this layout",
      terms: {}, parts: {}, part_short: {},
      why_text: {fastest: "fastest", short: "short by {v} GiB", as_fast: "as fast as the first (within 0.5 %)",
                 within_error: "over capacity within the memory error", undecided: "undecided: measure its memory first",
                 exposed: "communication exposed: {name} +{share} % of its step", part: "{name} +{share} % of its step"},
      batch: "batch", micro_batches: " in $1 micro-batches", sync_last: " (sync the last)", overlapped: " overlapped",
      words: {tokens: ["token", "tokens", "tokens"], params: ["parameter", "parameters", "parameters"],
                             sequences: ["sequence", "sequences", "sequences"]},
      err: {
        invalid_int: "argument {flag}: invalid int value: {value}",
        field_int: "{field}={value} must be an integer >= 1",
        heads_hidden: "heads={heads} does not divide hidden={hidden}",
        kv_heads: "kv_heads={kv_heads} does not divide heads={heads}",
        positions: "positions={value} must be >= 0",
        tp_model: "--tp {tp} does not divide {model}'s {what}={value}",
        positive: "{name} {value} must be an integer >= 1",
        gpus_inner: "--gpus {gpus} is not a multiple of dp-replicate x tp x cp = {r} x {tp} x {cp} = {inner}",
        gpus_nodes: "--gpus {gpus} is not a whole number of nodes of --gpus-per-node {gpn}",
        sp_tp: "--sp needs --tp > 1: sequence parallelism splits what TP replicates",
        sp_variant: "--sp-variant {v} must be one of {all}",
        no_sync: "--no-sync needs --micro-batches > 1: it skips the gradient sync of all micro-batches but the last",
        tp_overlap: "--tp-overlap needs --tp > 1: it overlaps TP's backward collectives",
        cp_seq: "--cp {cp} does not divide --seq {seq}",
        seq_chunks: "--seq {seq} must split into 2 x cp = {chunks} equal chunks: ring attention balances the causal mask with two chunks per CP rank",
        micro: "--micro-batches {m} does not divide --local-batch {b}",
        sp_tokens: "--tp {tp} does not divide the {tokens} tokens per CP rank: sequence parallelism splits them",
        float8: "--float8 needs fp8 tensor cores, which {gpu} does not have",
        tp_node: "--tp {tp} spans nodes of --gpus-per-node {gpn}: TP belongs inside a node",
      },
      decimal: ".", group: ",",
    },
    ru: {
      model: "Модель (--model)", custom: "свои размеры…", family: "Семейство", llama: "Llama (SwiGLU, RMSNorm, RoPE)",
      gpt2: "GPT-2 (GELU, LayerNorm, обучаемые позиции, голова с общим весом)", gpu: "GPU (--gpu)",
      hidden: "hidden", layers: "layers", heads: "heads", kv_heads: "kv_heads", ffn: "ffn", vocab: "vocab",
      gpus: "Число GPU (--gpus)", gpus_per_node: "GPU на узел (--gpus-per-node)",
      dp_replicate: "Реплики HSDP (--dp-replicate)", tp: "Тензорный параллелизм (--tp)",
      sp: "параллелизм по последовательности (--sp)", cp: "Контекстный параллелизм (--cp)",
      seq: "Длина последовательности (--seq)", local_batch: "Последовательностей на ранг параллелизма по данным (--local-batch)",
      micro_batches: "Микробатчи (--micro-batches)", ac: "Чекпоинтинг активаций (--ac)",
      float8: "линейные слои в float8 (--float8)", compile: "torch.compile (--compile)",
      compile_loss: "лосс тоже через torch.compile (--compile-loss)",
      reset: "опубликованный запуск torchtitan", params: "параметров",
      headline: "{model} ({params} {params_word}) на {gpus} × {gpu}: {layout}, {batch} × {seq} токенов на ранг параллелизма по данным, AC {ac}",
      fits: "Помещается: {peak} из {capacity}\u00a0ГиБ на GPU (свободно {free}\u00a0ГиБ); с учётом погрешности оценки по опубликованным запускам — {low}–{high}\u00a0ГиБ.",
      undecided: "Неясно: по расчёту {peak} из {capacity}\u00a0ГиБ на GPU, но с учётом погрешности оценки по опубликованным запускам — {low}–{high}\u00a0ГиБ: сначала измерьте.",
      short: "Не помещается: {peak} из {capacity}\u00a0ГиБ на GPU (по расчёту не хватает {short}\u00a0ГиБ); с учётом погрешности оценки по опубликованным запускам — {low}–{high}\u00a0ГиБ.",
      rate: "{rate} {tokens}/с на GPU, MFU {mfu}\u00a0%, шаг {step}\u00a0с.",
      published: "Опубликовано для этого запуска (torchtitan, docs/performance.md): {rate} {tokens}/с на GPU, MFU {mfu}\u00a0%.",
      memory: "Память GPU в пике", memory_table: "Все слагаемые", gib: "ГиБ", s: "с",
      capacity: "память GPU {x}\u00a0ГиБ", states: "состояния модели (параметры, градиенты и моменты AdamW в fp32)",
      root: "собранный корневой юнит", activations: "активации", loss: "логиты и лосс", gathered: "собранные блоки",
      root_grad: "градиент корневого юнита", block: "блок в backward (пересчитанный forward или буферы градиентов)",
      reserve: "запас аллокатора", peak_allocated: "пик выделенной памяти",
      peak_reserved: "пик зарезервированной памяти (torch.cuda.max_memory_reserved)",
      moment: {forward: "конец forward (лосс)", backward: "начало backward"},
      timeline: "Один шаг во времени", time_table: "Из чего складывается время шага",
      lane_gpu: "GPU", lane_nccl: "коллективные операции FSDP", step: "шаг",
      seg: {mm: "матричные произведения", attn: "внимание", elem: "операции, упирающиеся в память", tp: "обмен данными TP",
            cp: "кольцо CP", recompute: "пересчёт", copies: "копирование FSDP в буферы и из них", head: "голова и лосс", wait_ag: "ожидание AllGather",
            wait_rs: "ожидание ReduceScatter / AllReduce", optimizer: "шаг оптимизатора",
            ag: "AllGather (скрыты за forward, если успевают)", rs: "ReduceScatter и AllReduce HSDP"},
      ranking: "Все раскладки этих GPU при том же глобальном батче ({n} {sequences}), от быстрой к медленной",
      rank: "место", layout: "раскладка", mem: "ГиБ", tok: "токенов/с на GPU", mfu: "MFU", why: "почему не первая",
      more: "все раскладки ({n})", cli: "Те же числа в Python:", apply: "взять эту раскладку",
      terms: {}, parts: {},  // the lessons' Russian names of the planner's terms: D.ru_names (viz.planning.RU_NAMES)
      part_short: {
        "TP collectives (exposed)": "обмен данными TP", "CP ring (exposed)": "кольцо CP",
        "FSDP AllGather (exposed)": "AllGather FSDP", "FSDP ReduceScatter / HSDP AllReduce (exposed)": "ReduceScatter FSDP и AllReduce HSDP",
      },
      why_text: {fastest: "самая быстрая", short: "не хватает {v}\u00a0ГиБ", as_fast: "так же быстра, как первая (разница меньше 0,5\u00a0%)",
                 within_error: "с учётом погрешности оценки памяти не помещается", undecided: "неясно: сначала измерьте память",
                 exposed: "не скрыто за вычислениями: {name}, +{share}\u00a0% её шага", part: "{name}: +{share}\u00a0% её шага"},
      batch: "батч", micro_batches: " в $1 микробатчах", sync_last: " (синхронизация на последнем)",
      overlapped: " с перекрытием", words: {tokens: ["токен", "токена", "токенов"], params: ["параметр", "параметра", "параметров"],
                            sequences: ["последовательность", "последовательности", "последовательностей"]},
      err: {
        invalid_int: "аргумент {flag}: не целое число: {value}",
        field_int: "{field}={value}: нужно целое число ≥ 1",
        heads_hidden: "heads={heads} не делит hidden={hidden}",
        kv_heads: "kv_heads={kv_heads} не делит heads={heads}",
        positions: "positions={value}: нужно число ≥ 0",
        tp_model: "--tp {tp} не делит {what}={value} модели {model}",
        positive: "{name} {value}: нужно целое число ≥ 1",
        gpus_inner: "--gpus {gpus} не делится на dp-replicate × tp × cp = {r} × {tp} × {cp} = {inner}",
        gpus_nodes: "--gpus {gpus} — не целое число узлов по --gpus-per-node {gpn}",
        sp_tp: "--sp требует --tp > 1: параллелизм по последовательности делит то, что TP повторяет на каждом ранге",
        sp_variant: "--sp-variant {v} должен быть одним из: {all}",
        no_sync: "--no-sync требует --micro-batches > 1: синхронизация градиентов пропускается на всех микробатчах, кроме последнего",
        tp_overlap: "--tp-overlap требует --tp > 1: он перекрывает коллективные операции TP в backward",
        cp_seq: "--cp {cp} не делит --seq {seq}",
        seq_chunks: "--seq {seq} должна делиться на 2 × cp = {chunks} равных чанков: кольцевое внимание уравновешивает причинную маску двумя чанками на ранг CP",
        micro: "--micro-batches {m} не делит --local-batch {b}",
        sp_tokens: "--tp {tp} не делит {tokens} токенов на ранг CP: их делит параллелизм по последовательности",
        float8: "--float8 требует тензорных ядер с fp8, а у {gpu} их нет",
        tp_node: "--tp {tp} выходит за узел из --gpus-per-node {gpn}: TP работает внутри узла",
      },
      decimal: ",", group: "\u202f",
    },
  };
  P.MEMORY_TERMS.forEach(function (k) { TEXT.en.terms[k] = k; });
  P.STEP_PARTS.forEach(function (k) { TEXT.en.parts[k] = k; TEXT.en.part_short[k] = k.replace(" (exposed)", ""); });
  P.MEMORY_TERMS.forEach(function (k) { TEXT.ru.terms[k] = D.ru_names[k]; });
  P.STEP_PARTS.forEach(function (k) { TEXT.ru.parts[k] = D.ru_names[k]; });
  P.STEP_PARTS.forEach(function (k) { if (!TEXT.ru.part_short[k]) TEXT.ru.part_short[k] = TEXT.ru.parts[k]; });

  // the CLI's options, in the order `python -m fsdp_mini plan` defines them (argparse reads them in that order)
  var INT_FIELDS = ["gpus", "gpus_per_node", "dp_replicate", "tp", "cp", "seq", "local_batch", "micro_batches"];
  var FLAGS = ["sp", "float8", "compile", "compile_loss"];
  var SHAPES = ["hidden", "layers", "heads", "kv_heads", "ffn", "vocab"];
  var INT = /^\s*[+-]?\d+(_\d+)*\s*$/;  // what Python's int() reads (ASCII digits)

  function fill(template, values) { return template.replace(/\{(\w+)\}/g, function (_, k) { return values[k]; }); }

  // fsdp_mini.course.language.num: f"{x:,.{d}f}", in Russian a thin no-break space and a decimal comma
  function num(x, d, t) {
    var s = pyFixed(x, d), sign = s[0] === "-" ? "-" : "";
    if (sign) s = s.slice(1);
    var parts = s.split(".");
    var whole = parts[0].replace(/\B(?=(\d{3})+(?!\d))/g, t.group);
    return sign + whole + (parts.length > 1 ? t.decimal + parts[1] : "");
  }

  // fsdp_mini.course.language.plural: the Russian form that agrees with n (English: one for 1, else many)
  function plural(n, forms, t) {
    if (t !== TEXT.ru) return n === 1 ? forms[0] : forms[2];
    if (!Number.isInteger(n)) return forms[1];
    n = Math.abs(n);
    if (n % 10 === 1 && n % 100 !== 11) return forms[0];
    if (n % 10 >= 2 && n % 10 <= 4 && !(n % 100 >= 12 && n % 100 <= 14)) return forms[1];
    return forms[2];
  }

  function errorText(e, t) { return fill(t.err[e.key], e.values); }
  function whyText(w, t) {
    if (w.key === "short") return fill(t.why_text.short, {v: num(w.value, 1, t)});
    if (w.key !== "part") return t.why_text[w.key];
    var name = P.STEP_PARTS[w.part], share = pyFixed(w.share, 0);
    return fill(t.why_text[name.indexOf("exposed") >= 0 ? "exposed" : "part"], {name: t.part_short[name], share: share});
  }
  function describe(l, t) {
    return P.describe(l).replace(", batch ", ", " + t.batch + " ").replace(/ in (\d+) micro-batches/, t.micro_batches)
      .replace(" (sync the last)", t.sync_last).replace(" overlapped", t.overlapped);
  }

  // --- what the inputs say: a plan, or the first error Python would raise ---------------------------------
  function compute(v) {
    // argparse converts the options first, in order
    INT_FIELDS.forEach(function (name) {
      if (!INT.test(v[name])) {
        throw new core.PlanError("invalid_int", {flag: "--" + name.replace(/_/g, "-"), value: core.pyRepr(v[name])});
      }
    });
    var model;
    if (v.model === "custom") {
      var family = D.models[v.family];
      var spec = {name: "custom", mlp: family.mlp, norm: family.norm, bias: family.bias, tied: family.tied,
                  positions: family.positions};
      SHAPES.forEach(function (k) { spec[k] = INT.test(v[k]) ? parseInt(v[k].replace(/_/g, ""), 10) : v[k]; });
      model = P.modelSpec(spec);
    } else {
      model = P.getModel(v.model);
    }
    var gpu = P.getGpu(v.gpu);
    var fields = {ac: v.ac};
    INT_FIELDS.forEach(function (name) { fields[name] = parseInt(v[name].replace(/_/g, ""), 10); });
    FLAGS.forEach(function (name) { fields[name] = v[name]; });
    var l = P.layout(fields);
    var p = P.plan(model, gpu, l);
    return {plan: p, ranked: P.compare(model, gpu, l)};
  }

  // --- the page ---------------------------------------------------------------------------------------------
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  function idOf(name) { return "pl-" + name.replace(/_/g, "-"); }

  function build(root) {
    var lang = root.getAttribute("data-lang") === "ru" ? "ru" : "en";
    var t = TEXT[lang];
    var start = D.start;
    var form = el("form", {class: "pl-form", autocomplete: "off"});
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    var inputs = {};
    function field(name, control, cls) {
      inputs[name] = control;
      control.id = idOf(name);
      return el("div", {class: "pl-field" + (cls ? " " + cls : "")}, [el("label", {for: control.id, text: t[name]}), control]);
    }
    function check(name) {
      var box = el("input", {type: "checkbox", id: idOf(name)});
      inputs[name] = box;
      return el("div", {class: "pl-field pl-check"}, [box, el("label", {for: box.id, text: t[name]})]);
    }
    function select(options) {
      var s = el("select", {});
      options.forEach(function (o) { s.appendChild(el("option", {value: o[0], text: o[1]})); });
      return s;
    }
    function number() { return el("input", {type: "text", inputmode: "numeric", spellcheck: "false"}); }
    var modelNames = Object.keys(D.models);
    var families = [["llama3-8b", t.llama], ["gpt2", t.gpt2]].filter(function (f) { return D.models[f[0]]; });
    var grid = el("div", {class: "pl-grid"}, [
      field("model", select(modelNames.map(function (n) { return [n, n]; }).concat([["custom", t.custom]]))),
      field("gpu", select(Object.keys(D.gpus).map(function (n) { return [n, n]; }))),
      field("gpus", number()), field("gpus_per_node", number()), field("dp_replicate", number()),
      field("tp", number()), field("cp", number()), field("seq", number()), field("local_batch", number()),
      field("micro_batches", number()), field("ac", select(D.checkpointing.map(function (c) { return [c, c]; }))),
    ]);
    var shapes = el("div", {class: "pl-grid pl-shapes", id: "pl-shapes"}, [
      field("family", select(families.map(function (f) { return [f[0], f[1]]; })), "pl-wide")].concat(
      SHAPES.map(function (k) { return field(k, number()); })));
    var checks = el("div", {class: "pl-checks"}, FLAGS.map(check));
    var reset = el("button", {type: "button", class: "md-button pl-reset", id: "pl-reset", text: t.reset});
    form.appendChild(grid);
    form.appendChild(shapes);
    form.appendChild(checks);
    form.appendChild(reset);
    var out = el("div", {class: "pl-out", "aria-live": "polite"});
    root.textContent = "";
    root.appendChild(form);
    root.appendChild(out);

    function values() {
      var v = {};
      Object.keys(inputs).forEach(function (k) {
        v[k] = inputs[k].type === "checkbox" ? inputs[k].checked : inputs[k].value;
      });
      return v;
    }
    function setValues(v) {
      Object.keys(v).forEach(function (k) {
        if (!inputs[k]) return;
        if (inputs[k].type === "checkbox") inputs[k].checked = !!v[k];
        else inputs[k].value = String(v[k]);
      });
    }
    function shapesOf(name) {
      var m = D.models[name], v = {family: m.mlp === "gelu" ? "gpt2" : "llama3-8b"};
      SHAPES.forEach(function (k) { v[k] = m[k]; });
      return v;
    }
    function resetAll() {
      var v = {};
      INT_FIELDS.forEach(function (k) { v[k] = D.layout_defaults[k] !== undefined ? D.layout_defaults[k] : ""; });
      FLAGS.forEach(function (k) { v[k] = D.layout_defaults[k]; });
      v.ac = D.layout_defaults.ac;
      Object.keys(start).forEach(function (k) { if (k.indexOf("published") < 0) v[k] = start[k]; });
      setValues(Object.assign(v, shapesOf(start.model)));
    }
    inputs.model.addEventListener("change", function () {
      if (inputs.model.value !== "custom") setValues(shapesOf(inputs.model.value));
    });

    var state = {};
    function render() {
      var v = values();
      shapes.hidden = v.model !== "custom";
      out.textContent = "";
      var result;
      try {
        result = compute(v);
      } catch (e) {
        if (!(e instanceof core.PlanError)) throw e;
        state = {error: {en: errorText(e, TEXT.en), ru: errorText(e, TEXT.ru)}};
        out.appendChild(el("p", {class: "pl-error", id: "pl-error", role: "alert", "data-key": e.key, text: errorText(e, t)}));
        root.setAttribute("data-state", "error");
        return;
      }
      var p = result.plan, d = P.toDict(p);
      state = {plan: d, ranked: result.ranked.map(function (c) {
        return Object.assign({rank: c.rank, summary: P.describe(c.plan.layout), why: whyText(c.why, TEXT.en)}, P.toDict(c.plan));
      })};
      root.setAttribute("data-state", "ok");
      summary(p, d, v);
      memoryBar(p);
      memoryTable(p, d);
      timeline(p);
      timeTable(d);
      ranking(result.ranked, p);
      command(v);
    }

    function gib(x, digits) { return num(x, digits, t); }

    function summary(p, d, v) {
      var l = p.layout;
      out.appendChild(el("p", {class: "pl-headline", id: "pl-headline", text: fill(t.headline, {
        model: p.model.name, params: num(p.model.params, 0, t), params_word: plural(p.model.params, t.words.params, t), gpus: l.gpus, gpu: p.gpu.name,
        layout: describe(l, t).split(",")[0], batch: l.local_batch, seq: num(l.seq, 0, t), ac: l.ac})}));
      var word = {fits: "fits", undecided: "undecided", "does not fit": "short"}[d.verdict];
      var verdict = fill(t[word], {peak: gib(d.memory_gib, 1), capacity: gib(d.memory_capacity_gib, 1),
                                   free: gib(d.memory_capacity_gib - d.memory_gib, 1), short: gib(d.short_by_gib, 1),
                                   low: gib(d.memory_band_gib[0], 1), high: gib(d.memory_band_gib[1], 1)});
      out.appendChild(el("p", {class: "pl-verdict pl-" + word, id: "pl-verdict", "data-fits": String(d.fits),
                               "data-verdict": d.verdict}, [el("strong", {text: verdict}), " ",
        el("span", {id: "pl-rate", text: fill(t.rate, {rate: num(d.tokens_per_s_per_gpu, 0, t),
          tokens: plural(Number(pyFixed(d.tokens_per_s_per_gpu, 0)), t.words.tokens, t),
          mfu: num(d.mfu * 100, 1, t), step: num(d.step_s, 3, t)})})]));
      var s = D.start, l0 = p.layout;
      if (v.model === s.model && v.gpu === s.gpu && l0.gpus === s.gpus && l0.seq === s.seq && l0.local_batch === s.local_batch &&
          l0.tp === s.tp && l0.cp === 1 && l0.dp_replicate === 1 && l0.ac === s.ac && !l0.float8 && !l0.compile && !l0.compile_loss &&
          l0.micro_batches === 1 && l0.gpus_per_node === D.layout_defaults.gpus_per_node) {
        out.appendChild(el("p", {class: "pl-published", text: fill(t.published, {rate: num(s.published_tokens_per_s, 0, t),
          tokens: plural(s.published_tokens_per_s, t.words.tokens, t),
          mfu: num(s.published_mfu * 100, 1, t)})}));
      }
    }

    // the peak, as a bar: what is held all step, what the peak's moment adds, the allocator's reserve; capacity marked
    function memoryBar(p) {
      var m = p.memory, b = m.bar, G = D.constants.GiB;
      var segs = [["states", b.states.reduce(function (a, x) { return a + x; }, 0)], ["root", b.root], ["activations", b.activations]];
      Object.keys(b.moment_parts).forEach(function (k) { segs.push([k, b.moment_parts[k]]); });
      segs.push(["reserve", m.peak_reserved - m.peak_allocated]);
      var scale = Math.max(m.capacity, m.peak_reserved);
      out.appendChild(el("h3", {text: t.memory + " — " + t.moment[m.moment]}));
      var track = el("div", {class: "pl-membar", id: "pl-membar", role: "img",
        "aria-label": t.memory + ": " + gib(m.peak_reserved / G, 1) + " / " + gib(m.capacity / G, 1) + " " + t.gib});
      segs.forEach(function (s) {
        if (s[1] <= 0) return;
        track.appendChild(el("div", {class: "pl-seg pl-m-" + s[0], "data-part": s[0], title: t[s[0]] + ": " + gib(s[1] / G, 2) + " " + t.gib,
                                     style: "width:" + (100 * s[1] / scale) + "%"}));
      });
      track.appendChild(el("div", {class: "pl-capacity", style: "left:" + (100 * m.capacity / scale) + "%"}));
      out.appendChild(track);
      var axis = el("div", {class: "pl-membar-axis"}, [el("span", {text: "0"}),
        el("span", {class: "pl-capacity-label", style: "left:" + (100 * m.capacity / scale) + "%",
                    text: fill(t.capacity, {x: gib(m.capacity / G, 0)})})]);
      out.appendChild(axis);
      var legend = el("ul", {class: "pl-legend"});
      segs.forEach(function (s) {
        if (s[1] <= 0) return;
        legend.appendChild(el("li", {}, [el("span", {class: "pl-swatch pl-m-" + s[0]}),
          el("span", {text: t[s[0]] + " "}), el("b", {text: gib(s[1] / G, 1) + "\u00a0" + t.gib})]));
      });
      out.appendChild(legend);
    }

    function memoryTable(p, d) {
      var details = el("details", {class: "pl-details"}, [el("summary", {text: t.memory_table})]);
      var table = el("table", {class: "pl-table", id: "pl-memory"});
      Object.keys(d.memory).forEach(function (k) {
        table.appendChild(el("tr", {"data-key": k}, [el("td", {text: t.terms[k]}),
          el("td", {class: "pl-num", text: gib(d.memory[k], 2)}), el("td", {text: t.gib})]));
      });
      [["peak_allocated", d.memory_allocated_gib, t.peak_allocated + " (" + t.moment[p.memory.moment] + ")"],
       ["peak_reserved", d.memory_gib, t.peak_reserved]].forEach(function (r) {
        table.appendChild(el("tr", {"data-key": r[0], class: "pl-total"}, [el("td", {text: r[2]}),
          el("td", {class: "pl-num", text: gib(r[1], 2)}), el("td", {text: t.gib})]));
      });
      details.appendChild(table);
      out.appendChild(details);
    }

    // one step in time: each micro-batch's forward, head and loss, backward, then the optimizer; FSDP's
    // collectives on their own lane beside the work they hide behind
    function timeline(p) {
      var tl = p.time.timeline, step = p.time.step_s;
      out.appendChild(el("h3", {text: t.timeline}));
      var box = el("div", {class: "pl-timeline", id: "pl-timeline", role: "img", "aria-label": t.timeline});
      var gpuLane = el("div", {class: "pl-lane-track"}), ncclLane = el("div", {class: "pl-lane-track"});
      var at = 0, used = {};
      function seg(lane, kind, seconds, from) {
        if (!(seconds > 0)) return;
        used[kind] = (used[kind] || 0) + seconds;
        lane.appendChild(el("div", {class: "pl-seg pl-t-" + kind, "data-kind": kind, "data-seconds": String(seconds),
          title: t.seg[kind] + ": " + num(seconds, 3, t) + " " + t.s,
          style: "left:" + (100 * from / step) + "%;width:" + (100 * seconds / step) + "%"}));
      }
      var KINDS = ["mm", "attn", "elem", "tp", "cp"];
      for (var i = 0; i < tl.micro_batches; i++) {
        var forwardStart = at;
        seg(gpuLane, "wait_ag", tl.fwd_wait, at); at += tl.fwd_wait;
        tl.forward.forEach(function (s, k) { seg(gpuLane, KINDS[k], s, at); at += s; });
        seg(ncclLane, "ag", tl.gathers, forwardStart);
        seg(gpuLane, "head", tl.head[0] + tl.head[1], at); at += tl.head[0] + tl.head[1];
        var backwardStart = at;
        tl.backward.forEach(function (s, k) { var kind = k < 5 ? KINDS[k] : k === 5 ? "recompute" : "copies"; seg(gpuLane, kind, s, at); at += s; });
        seg(gpuLane, "wait_rs", tl.bwd_wait, at); at += tl.bwd_wait;
        seg(ncclLane, "rs", tl.reductions, backwardStart);
      }
      seg(gpuLane, "optimizer", tl.optimizer, at);
      box.appendChild(el("div", {class: "pl-lane"}, [el("span", {class: "pl-lane-name", text: t.lane_gpu}), gpuLane]));
      box.appendChild(el("div", {class: "pl-lane"}, [el("span", {class: "pl-lane-name", text: t.lane_nccl}), ncclLane]));
      // a time axis with round ticks
      var raw = step / 4, mag = Math.pow(10, Math.floor(Math.log10(raw)));
      var tick = [1, 2, 5, 10].map(function (k) { return k * mag; }).filter(function (x) { return x >= raw; })[0];
      var digits = Math.max(0, -Math.floor(Math.log10(tick)));
      var axis = el("div", {class: "pl-axis"});
      for (var x = 0; x <= step * 1.0001; x += tick) {
        axis.appendChild(el("span", {style: "left:" + (100 * x / step) + "%", text: num(x, digits, t) + "\u00a0" + t.s}));
      }
      box.appendChild(el("div", {class: "pl-lane pl-axis-lane"}, [el("span", {class: "pl-lane-name"}), axis]));
      out.appendChild(box);
      var legend = el("ul", {class: "pl-legend"});
      ["mm", "attn", "elem", "copies", "tp", "cp", "recompute", "head", "wait_ag", "wait_rs", "optimizer", "ag", "rs"].forEach(function (k) {
        if (!used[k]) return;
        legend.appendChild(el("li", {}, [el("span", {class: "pl-swatch pl-t-" + k}), el("span", {text: t.seg[k] + " "}),
          el("b", {text: num(used[k], 3, t) + "\u00a0" + t.s})]));
      });
      out.appendChild(legend);
    }

    function timeTable(d) {
      var details = el("details", {class: "pl-details"}, [el("summary", {text: t.time_table})]);
      var table = el("table", {class: "pl-table", id: "pl-time"});
      Object.keys(d.step_parts_s).forEach(function (k) {
        table.appendChild(el("tr", {"data-key": k}, [el("td", {text: t.parts[k]}),
          el("td", {class: "pl-num", text: num(d.step_parts_s[k], 3, t)}), el("td", {text: t.s})]));
      });
      table.appendChild(el("tr", {"data-key": "step", class: "pl-total"}, [el("td", {text: t.step}),
        el("td", {class: "pl-num", text: num(d.step_s, 3, t)}), el("td", {text: t.s})]));
      details.appendChild(table);
      out.appendChild(details);
    }

    function ranking(ranked, p) {
      var l = p.layout;
      out.appendChild(el("h3", {text: fill(t.ranking, {n: num(l.local_batch * l.dp, 0, t), sequences: plural(l.local_batch * l.dp, t.words.sequences, t)})}));
      var SHOWN = 12;
      function table(rows, id) {
        var tb = el("table", {class: "pl-table pl-rank", id: id});
        tb.appendChild(el("tr", {}, [t.rank, t.layout, t.mem, t.tok, t.mfu, t.why].map(function (h) { return el("th", {text: h}); })));
        rows.forEach(function (c) {
          var q = c.plan, cl = q.layout;
          var same = P.describe(cl) === P.describe(l) && cl.float8 === l.float8;
          var row = el("tr", {"data-rank": c.rank === null ? "-" : String(c.rank), class: same ? "pl-chosen" : "",
                              title: t.apply}, [
            el("td", {class: "pl-num", text: c.rank === null ? "–" : String(c.rank)}),
            el("td", {class: "pl-layout", text: describe(cl, t)}),
            el("td", {class: "pl-num", "data-label": t.mem, text: num(q.memory.peak_reserved / D.constants.GiB, 1, t)}),
            el("td", {class: "pl-num", "data-label": t.tok, text: num(q.time.tokens_per_s_per_gpu, 0, t)}),
            el("td", {class: "pl-num", "data-label": "% " + t.mfu, text: num(q.time.mfu * 100, 1, t)}),
            el("td", {class: "pl-why", text: whyText(c.why, t)})]);
          row.addEventListener("click", function () {
            setValues({dp_replicate: cl.dp_replicate, tp: cl.tp, sp: cl.sp, cp: cl.cp, ac: cl.ac, local_batch: cl.local_batch});
            render();
          });
          tb.appendChild(row);
        });
        return tb;
      }
      var wrap = el("div", {class: "pl-scroll"}, [table(ranked.slice(0, SHOWN), "pl-rank")]);
      out.appendChild(wrap);
      if (ranked.length > SHOWN) {
        out.appendChild(el("details", {class: "pl-details"}, [el("summary", {text: fill(t.more, {n: ranked.length})}),
          el("div", {class: "pl-scroll"}, [table(ranked, "pl-rank-all")])]));
      }
    }

    function command(v) {
      var text;
      var opts = [];
      INT_FIELDS.forEach(function (k) {
        var value = parseInt(v[k].replace(/_/g, ""), 10);
        if (D.layout_defaults[k] === undefined || value !== D.layout_defaults[k]) opts.push("--" + k.replace(/_/g, "-") + " " + value);
      });
      if (v.ac !== D.layout_defaults.ac) opts.push("--ac " + v.ac);
      FLAGS.forEach(function (k) { if (v[k]) opts.push("--" + k.replace(/_/g, "-")); });
      if (v.model === "custom") {
        var m = D.models[v.family];
        var shape = SHAPES.map(function (k) { return k + "=" + parseInt(v[k].replace(/_/g, ""), 10); }).join(", ");
        var kw = INT_FIELDS.map(function (k) { return k + "=" + parseInt(v[k].replace(/_/g, ""), 10); })
          .concat(FLAGS.filter(function (k) { return v[k]; }).map(function (k) { return k + "=True"; }))
          .concat(v.ac !== D.layout_defaults.ac ? ["ac=\"" + v.ac + "\""] : []);
        text = "from fsdp_mini.course.planner import Layout, custom_model, get_gpu, plan\n" +
          "model = custom_model(\"custom\", " + shape + ",\n                     mlp=\"" + m.mlp + "\", norm=\"" + m.norm +
          "\", bias=" + core.pyRepr(m.bias) + ", tied=" + core.pyRepr(m.tied) + ", positions=" + m.positions + ")\n" +
          "plan(model, get_gpu(\"" + v.gpu + "\"), Layout(" + kw.join(", ") + ")).to_dict()";
      } else {
        text = "python -m fsdp_mini plan --model " + v.model + " --gpu " + v.gpu + " " + opts.join(" ") + " [--json] [--compare]";
      }
      out.appendChild(el("p", {text: t.cli}));
      out.appendChild(el("pre", {class: "pl-python"}, [el("code", {id: "pl-cli", text: text})]));
    }

    form.addEventListener("input", render);
    form.addEventListener("change", render);
    reset.addEventListener("click", function () { resetAll(); render(); });
    resetAll();
    render();
    window.planner.state = function () { return state; };
  }

  window.planner = {core: core, planner: P, text: TEXT, data: D, num: num};
  function startPage() {
    var root = document.getElementById("planner");
    if (root) build(root);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", startPage);
  else startPage();
})();
