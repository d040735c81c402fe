/* The memory calculator of the course site (lessons/en/calculator.md, lessons/ru/calculator.md).
 *
 * Plain JavaScript, no library, nothing fetched: it fills <div id="memory-calculator" data-lang="en|ru">.
 * The arithmetic is fsdp_mini.estimate_memory's (fsdp_mini/memory.py), line for line, in exact integers
 * (BigInt): tensor parallelism of degree tp first leaves ceil(num_params / tp) parameters to each TP rank;
 * a state a strategy shards then costs ceil(that / G) elements per rank, G being the shard group among the
 * world / tp data-parallel ranks (1 for NO_SHARD, all of them for ZeRO-1/2/3, shard_size for the hybrids);
 * a replicated state costs the TP rank's whole share. Sizes print as fsdp_mini.format_bytes prints them
 * (decimal units, one decimal, Python's round-half-even), in Russian with a decimal comma and Russian units.
 * tests/site/test_site.py sets the inputs in Chromium and compares every number with Python's.
 */
(function () {
  "use strict";

  // fsdp_mini.strategy: which model states each strategy shards, and whether it shards inside a group.
  var STRATEGIES = [
    {name: "NO_SHARD", zero: "DDP", sharded: [], group: "one"},
    {name: "ZERO1", zero: "ZeRO-1", sharded: ["optimizer"], group: "world"},
    {name: "SHARD_GRAD_OP", zero: "ZeRO-2", sharded: ["grads", "optimizer"], group: "world"},
    {name: "FULL_SHARD", zero: "ZeRO-3", sharded: ["params", "grads", "optimizer"], group: "world"},
    {name: "HYBRID_SHARD", zero: "ZeRO-3 + DDP", sharded: ["params", "grads", "optimizer"], group: "shard"},
    {name: "_HYBRID_SHARD_ZERO2", zero: "ZeRO-2 + DDP", sharded: ["grads", "optimizer"], group: "shard"},
  ];
  var STATES = ["params", "grads", "optimizer"];
  var DTYPES = [["fp32", 4], ["bf16", 2], ["fp16", 2]];
  // optimizer: how many per-parameter tensors it keeps (besides a master copy)
  var OPTIMIZERS = [["adam", 2], ["sgd_momentum", 1], ["sgd", 0]];

  var TEXT = {
    en: {
      params: "Parameters", params_hint: "e.g. 7.5e9, 7.5B, 125M, 1,300,000",
      world: "World size (ranks, GPUs)", strategy: "Strategy", shard: "Shard group size (ranks per group)",
      shard_hint: "usually one node: 8", shard_hint_tp: "in data-parallel ranks, of which there are {dp}",
      tp: "Tensor-parallel degree (TP)", tp_hint: "1: no tensor parallelism; 8: one node",
      tp_split: "tensor parallelism splits the parameters over tp = {tp} ranks first: ⌈N / {tp}⌉ = {n} each; ",
      group_tp: "each sharded state is then split over G = {g} of the {dp} data-parallel ranks",
      param_dtype: "Parameter dtype", grad_dtype: "Gradient (reduce) dtype",
      optimizer: "Optimizer", state_dtype: "Optimizer state dtype",
      master: "fp32 master copy of the weights (mixed precision)",
      master_fp32: "no separate master copy: the parameters are fp32 already",
      opt: {adam: "Adam / AdamW (2 states: m, v)", sgd_momentum: "SGD with momentum (1 state)", sgd: "SGD without momentum (no state)"},
      strat: {NO_SHARD: "NO_SHARD (DDP): nothing sharded", ZERO1: "ZeRO-1: optimizer state sharded",
              SHARD_GRAD_OP: "SHARD_GRAD_OP (ZeRO-2): + gradients", FULL_SHARD: "FULL_SHARD (ZeRO-3): + parameters",
              HYBRID_SHARD: "HYBRID_SHARD: ZeRO-3 in a group, replicated across groups",
              _HYBRID_SHARD_ZERO2: "_HYBRID_SHARD_ZERO2: ZeRO-2 in a group, replicated across groups"},
      state: {params: "parameters", grads: "gradients", optimizer: "optimizer state"},
      total: "total", per_rank: "Bytes per rank", all: "All strategies at these settings",
      col_strategy: "strategy", col_sharded: "sharded", col_total: "per rank",
      sharded_none: "nothing", k: "K = {k} bytes of optimizer state per parameter",
      k_parts: "{parts}", master_part: "fp32 master weights 4", state_part: "{what} {n} × {b}", moments: {adam: "Adam's m and v", sgd_momentum: "momentum"},
      per_param: "{p} + {g} + {k} = {sum} bytes per parameter before sharding",
      group: "each sharded state is split over G = {g} ranks",
      python: "The same numbers in Python:",
      parsed: "= {n} parameters", reset: "ZeRO paper, Figure 1",
      err_params: "Parameters: a whole number such as 7.5e9, 7.5B or 125M",
      err_world: "World size: a whole number ≥ 1",
      err_shard: "Shard group size must be a positive divisor of the world size {w}",
      err_shard_tp: "Shard group size must be a positive divisor of the {dp} data-parallel ranks (world size {w} ÷ TP {tp})",
      err_tp: "TP degree must be a whole number ≥ 1 that divides the world size {w}",
      figure: "ZeRO's Figure 1: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB",
      decimal: ".", group_sep: ",", units: ["B", "kB", "MB", "GB", "TB", "PB"],
    },
    ru: {
      params: "Число параметров", params_hint: "например 7.5e9, 7,5 млрд, 125 млн, 1 300 000",
      world: "Число рангов (GPU)", strategy: "Стратегия", shard: "Размер группы шардирования (рангов в группе)",
      shard_hint: "обычно один узел: 8", shard_hint_tp: "в рангах параллелизма по данным; их {dp}",
      tp: "Степень тензорного параллелизма (TP)", tp_hint: "1 — без тензорного параллелизма; 8 — один узел",
      tp_split: "тензорный параллелизм сначала делит параметры на tp = {tp} рангов: по ⌈N / {tp}⌉ = {n}; ",
      group_tp: "затем каждое шардированное состояние делится на G = {g} из {dp} рангов параллелизма по данным",
      param_dtype: "Тип параметров", grad_dtype: "Тип градиентов (и редукции)",
      optimizer: "Оптимизатор", state_dtype: "Тип состояния оптимизатора",
      master: "мастер-копия весов в fp32 (смешанная точность)",
      master_fp32: "отдельной мастер-копии нет: параметры и так в fp32",
      opt: {adam: "Adam / AdamW (2 тензора: m, v)", sgd_momentum: "SGD с моментом (1 тензор)", sgd: "SGD без момента (без состояния)"},
      strat: {NO_SHARD: "NO_SHARD (DDP): ничего не шардируется", ZERO1: "ZeRO-1: шардируется состояние оптимизатора",
              SHARD_GRAD_OP: "SHARD_GRAD_OP (ZeRO-2): + градиенты", FULL_SHARD: "FULL_SHARD (ZeRO-3): + параметры",
              HYBRID_SHARD: "HYBRID_SHARD: ZeRO-3 внутри группы, реплики между группами",
              _HYBRID_SHARD_ZERO2: "_HYBRID_SHARD_ZERO2: ZeRO-2 внутри группы, реплики между группами"},
      state: {params: "параметры", grads: "градиенты", optimizer: "состояние оптимизатора"},
      total: "всего", per_rank: "Байт на ранг", all: "Все стратегии при этих настройках",
      col_strategy: "стратегия", col_sharded: "шардируется", col_total: "на ранг",
      sharded_none: "ничего", k: "K = {k} байт состояния оптимизатора на параметр",
      k_parts: "{parts}", master_part: "мастер-веса fp32 4", state_part: "{what} {n} × {b}", moments: {adam: "моменты Adam m и v", sgd_momentum: "момент"},
      per_param: "{p} + {g} + {k} = {sum} байт на параметр до шардирования",
      group: "каждое шардированное состояние делится на G = {g} рангов",
      python: "Те же числа в Python:",
      parsed: "= {n} параметров", reset: "ZeRO, рисунок 1",
      err_params: "Число параметров: целое, например 7.5e9, 7,5 млрд или 125 млн",
      err_world: "Число рангов: целое число ≥ 1",
      err_shard: "Размер группы шардирования должен быть положительным делителем числа рангов {w}",
      err_shard_tp: "Размер группы шардирования должен быть положительным делителем числа рангов параллелизма по данным: {dp} (всего рангов {w} ÷ TP {tp})",
      err_tp: "Степень TP должна быть целым числом ≥ 1 и делить число рангов {w}",
      figure: "Рисунок 1 из ZeRO: базовый случай 120 ГБ, P_os 31,4 ГБ, P_os+g 16,6 ГБ, P_os+g+p 1,9 ГБ",
      decimal: ",", group_sep: "\u00a0", units: ["Б", "кБ", "МБ", "ГБ", "ТБ", "ПБ"],
    },
  };
  var STATE_SHORT = {en: {params: "p", grads: "g", optimizer: "os"}, ru: {params: "p", grads: "g", optimizer: "os"}};

  // The ZeRO paper's Figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam (K = 12).
  var DEFAULTS = {params: "7.5e9", world: "64", tp: "1", strategy: "FULL_SHARD", shard: "8", param_dtype: "2:bf16",
                  grad_dtype: "2:bf16", optimizer: "adam", state_dtype: "4:fp32", master: true};

  // --- arithmetic: fsdp_mini.estimates.estimate_memory -------------------------------------------------
  // `dp` ranks share the data (world / tp); a strategy shards over all of them, one, or a group of `shard`
  function groupSize(strategy, dp, shard) {
    if (strategy.group === "one") return 1n;
    if (strategy.group === "world") return dp;
    if (shard === null || shard < 1n || dp % shard !== 0n) return null;
    return shard;
  }

  function validTp(world, tp) {
    return tp !== null && tp >= 1n && world % tp === 0n;
  }

  function estimate(numParams, world, strategy, shard, paramBytes, gradBytes, optimizerBytes, tp) {
    tp = tp === undefined ? 1n : tp;
    if (!validTp(world, tp)) return null;
    var g = groupSize(strategy, world / tp, shard);
    if (g === null) return null;
    var share = (numParams + tp - 1n) / tp;  // ceil: tensor parallelism splits the parameters first
    var perByte = {params: paramBytes, grads: gradBytes, optimizer: optimizerBytes};
    var out = {group: g, tp: tp, dp: world / tp, share: share, total: 0n};
    STATES.forEach(function (state) {
      var elements = strategy.sharded.indexOf(state) >= 0 ? (share + g - 1n) / g : share;  // ceil
      out[state] = elements * BigInt(perByte[state]);
      out.total += out[state];
    });
    return out;
  }

  // --- parsing: "7.5e9", "7.5B", "7,5 млрд", "1,300,000", "1 300 000" -> BigInt, or null -------------
  var SUFFIX = {"": 0, k: 3, "тыс": 3, m: 6, "млн": 6, b: 9, g: 9, "млрд": 9, t: 12, "трлн": 12};

  function parseCount(text) {
    var s = String(text).trim().toLowerCase().replace(/[\s\u00a0\u202f_']/g, "");
    if (/^\d{1,3}(,\d{3})+$/.test(s)) s = s.replace(/,/g, "");  // thousands separators
    s = s.replace(",", ".");                                      // a decimal comma
    var m = /^(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?(k|m|b|g|t|тыс|млн|млрд|трлн)?\.?$/.exec(s);
    if (!m || !(m[1] || m[2])) return null;
    var frac = m[2] || "";
    var digits = BigInt((m[1] || "0") + frac);
    var exp = (m[3] ? parseInt(m[3], 10) : 0) + SUFFIX[m[4] || ""] - frac.length;
    if (Math.abs(exp) > 60) return null;
    if (exp >= 0) return digits * 10n ** BigInt(exp);
    var div = 10n ** BigInt(-exp);
    return digits % div === 0n ? digits / div : null;  // only whole numbers of parameters
  }

  function parseWhole(text) {
    var s = String(text).trim();
    return /^\d+$/.test(s) ? BigInt(s) : null;
  }

  // --- formatting: fsdp_mini.byte_format.format_bytes --------------------------------------------------
  // Python's f"{x:.1f}" rounds the exact binary value half to even; toFixed rounds exact ties up. A double
  // is exactly halfway between two tenths only when 4x is an odd integer (x = 1.25, 16.75, ...).
  function fixed1(x) {
    var q = x * 4;
    if (Number.isInteger(q) && q % 2 !== 0) {
      var lo = Math.floor(x * 10);  // exact: x * 10 is a multiple of 0.5 here
      var n = lo % 2 === 0 ? lo : lo + 1;
      return (n / 10).toFixed(1);
    }
    return x.toFixed(1);
  }

  function formatBytes(nbytes, t) {
    var units = t.units;
    if (nbytes < 1000n) return nbytes.toString() + "\u00a0" + units[0];
    var value = Number(nbytes), unit = 0;
    while (unit < units.length - 1 && parseFloat(fixed1(value)) >= 1000) {
      value = value / 1000;
      unit += 1;
    }
    return fixed1(value).replace(".", t.decimal) + "\u00a0" + units[unit];
  }

  function group3(n, sep) {
    return n.toString().replace(/\B(?=(\d{3})+(?!\d))/g, sep);
  }

  function fill(template, values) {
    return template.replace(/\{(\w+)\}/g, function (_, k) { return values[k]; });
  }

  // --- the page ------------------------------------------------------------------------------------------
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { node.appendChild(c); });
    return node;
  }

  function field(id, label, control, hint) {
    var box = el("div", {class: "mc-field"}, [el("label", {for: id, text: label}), control]);
    if (hint) box.appendChild(el("small", {class: "mc-hint", id: id + "-hint", text: hint}));
    return box;
  }

  function select(id, options, value) {
    var s = el("select", {id: id});
    options.forEach(function (o) {
      var opt = el("option", {value: o[0], text: o[1]});
      if (o[0] === value) opt.selected = true;
      s.appendChild(opt);
    });
    return s;
  }

  function build(root) {
    var lang = root.getAttribute("data-lang") === "ru" ? "ru" : "en";
    var t = TEXT[lang];
    var dtypeOptions = DTYPES.map(function (d) { return [d[1] + ":" + d[0], d[0] + " (" + d[1] + " " + t.units[0] + ")"]; });
    var form = el("form", {class: "mc-form", autocomplete: "off"});
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    var inputs = {
      params: el("input", {id: "mc-params", type: "text", inputmode: "decimal", value: DEFAULTS.params, spellcheck: "false"}),
      world: el("input", {id: "mc-world", type: "number", min: "1", step: "1", value: DEFAULTS.world}),
      tp: el("input", {id: "mc-tp", type: "number", min: "1", step: "1", value: DEFAULTS.tp}),
      strategy: select("mc-strategy", STRATEGIES.map(function (s) { return [s.name, t.strat[s.name]]; }), DEFAULTS.strategy),
      shard: el("input", {id: "mc-shard", type: "number", min: "1", step: "1", value: DEFAULTS.shard}),
      param_dtype: select("mc-param-dtype", dtypeOptions, DEFAULTS.param_dtype),
      grad_dtype: select("mc-grad-dtype", dtypeOptions, DEFAULTS.grad_dtype),
      optimizer: select("mc-optimizer", OPTIMIZERS.map(function (o) { return [o[0], t.opt[o[0]]]; }), DEFAULTS.optimizer),
      state_dtype: select("mc-state-dtype", dtypeOptions, DEFAULTS.state_dtype),
      master: el("input", {id: "mc-master", type: "checkbox"}),
    };
    inputs.master.checked = DEFAULTS.master;
    var reset = el("button", {type: "button", class: "md-button mc-reset", id: "mc-reset", text: t.reset});
    var masterBox = el("div", {class: "mc-field mc-check"}, [inputs.master,
      el("label", {for: "mc-master", id: "mc-master-label", text: t.master})]);
    form.appendChild(el("div", {class: "mc-grid"}, [
      field("mc-params", t.params, inputs.params, t.params_hint),
      field("mc-world", t.world, inputs.world),
      field("mc-tp", t.tp, inputs.tp, t.tp_hint),
      field("mc-strategy", t.strategy, inputs.strategy),
      field("mc-shard", t.shard, inputs.shard, t.shard_hint),
      field("mc-param-dtype", t.param_dtype, inputs.param_dtype),
      field("mc-grad-dtype", t.grad_dtype, inputs.grad_dtype),
      field("mc-optimizer", t.optimizer, inputs.optimizer),
      field("mc-state-dtype", t.state_dtype, inputs.state_dtype),
      masterBox,
      el("div", {class: "mc-field"}, [reset]),
    ]));
    var out = el("div", {class: "mc-out", "aria-live": "polite"});
    root.textContent = "";
    root.appendChild(form);
    root.appendChild(out);

    function bytesOf(select) { return parseInt(select.value.split(":")[0], 10); }

    function render() {
      var numParams = parseCount(inputs.params.value);
      var world = parseWhole(inputs.world.value);
      var strategy = STRATEGIES.filter(function (s) { return s.name === inputs.strategy.value; })[0];
      var hybrid = strategy.group === "shard";
      inputs.shard.disabled = !hybrid;
      inputs.shard.closest(".mc-field").classList.toggle("mc-off", !hybrid);
      var paramBytes = bytesOf(inputs.param_dtype), gradBytes = bytesOf(inputs.grad_dtype);
      var nStates = OPTIMIZERS.filter(function (o) { return o[0] === inputs.optimizer.value; })[0][1];
      var stateBytes = bytesOf(inputs.state_dtype);
      var masterApplies = paramBytes < 4;
      inputs.master.disabled = !masterApplies;
      document.getElementById("mc-master-label").textContent = masterApplies ? t.master : t.master_fp32;
      var master = masterApplies && inputs.master.checked ? 4 : 0;
      var k = nStates * stateBytes + master;
      var shard = hybrid ? parseWhole(inputs.shard.value) : null;
      var tp = parseWhole(inputs.tp.value);
      var worldOk = world !== null && world >= 1n;
      var tpOk = worldOk && validTp(world, tp);
      inputs.tp.setAttribute("aria-invalid", worldOk && !tpOk ? "true" : "false");
      document.getElementById("mc-shard-hint").textContent = tpOk && tp > 1n
        ? fill(t.shard_hint_tp, {dp: (world / tp).toString()}) : t.shard_hint;

      out.textContent = "";
      var errors = [];
      if (numParams === null) errors.push(t.err_params);
      if (!worldOk) errors.push(t.err_world);
      else if (!tpOk) errors.push(fill(t.err_tp, {w: world.toString()}));
      var result = errors.length ? null : estimate(numParams, world, strategy, shard, paramBytes, gradBytes, k, tp);
      if (!errors.length && result === null) {
        errors.push(tp > 1n ? fill(t.err_shard_tp, {dp: (world / tp).toString(), w: world.toString(), tp: tp.toString()})
                            : fill(t.err_shard, {w: world.toString()}));
      }
      inputs.params.setAttribute("aria-invalid", numParams === null ? "true" : "false");
      document.getElementById("mc-params-hint").textContent =
        numParams === null ? t.params_hint : fill(t.parsed, {n: group3(numParams, t.group_sep)});
      if (errors.length) {
        errors.forEach(function (e) { out.appendChild(el("p", {class: "mc-error", role: "alert", text: e})); });
        root.setAttribute("data-state", "error");
        return;
      }
      root.setAttribute("data-state", "ok");

      // what K is made of
      var parts = [];
      if (master) parts.push(t.master_part);
      if (nStates) parts.push(fill(t.state_part, {n: nStates, b: stateBytes, what: t.moments[inputs.optimizer.value]}));
      out.appendChild(el("p", {class: "mc-facts"}, [
        el("span", {text: fill(t.k, {k: k}) + (parts.length ? " = " + parts.join(" + ") : "") + ". "}),
        el("span", {text: fill(t.per_param, {p: paramBytes, g: gradBytes, k: k, sum: paramBytes + gradBytes + k}) + "; "}),
        el("span", {text: tp > 1n
          ? fill(t.tp_split, {tp: tp.toString(), n: group3(result.share, t.group_sep)}) +
            fill(t.group_tp, {g: result.group.toString(), dp: result.dp.toString()}) + "."
          : fill(t.group, {g: result.group.toString()}) + "."}),
      ]));

      // the bars of the chosen strategy
      var scale = estimate(numParams, world, STRATEGIES[0], null, paramBytes, gradBytes, k).total;  // NO_SHARD
      out.appendChild(el("h3", {text: t.per_rank + ": " + strategy.name}));
      var table = el("table", {class: "mc-bars", id: "mc-result"});
      STATES.concat(["total"]).forEach(function (state) {
        var bytes = result[state];
        var pct = scale > 0n ? Number(bytes * 10000n / scale) / 100 : 0;
        var bar = el("div", {class: "mc-bar mc-" + state, style: "width:" + Math.max(pct, bytes > 0n ? 0.3 : 0) + "%"});
        var name = state === "total" ? t.total : t.state[state];
        var sharded = state !== "total" && strategy.sharded.indexOf(state) >= 0;
        table.appendChild(el("tr", {"data-state": state}, [
          el("th", {scope: "row", text: name + (state !== "total" && tp > 1n ? " ÷ " + tp : "") +
                                        (sharded ? " ÷ " + result.group : "")}),
          el("td", {class: "mc-track"}, [bar]),
          el("td", {class: "mc-size", text: formatBytes(bytes, t)}),
          el("td", {class: "mc-bytes", "data-bytes": bytes.toString(), text: group3(bytes, t.group_sep) + "\u00a0" + t.units[0]}),
        ]));
      });
      out.appendChild(table);

      // every strategy side by side, as in ZeRO's Figure 1
      out.appendChild(el("h3", {text: t.all}));
      var all = el("table", {class: "mc-all", id: "mc-all"});
      all.appendChild(el("tr", {}, [el("th", {text: t.col_strategy}), el("th", {text: t.col_sharded}),
        el("th", {class: "mc-track", text: t.state.params + " / " + t.state.grads + " / " + t.state.optimizer}),
        el("th", {text: t.col_total})]));
      STRATEGIES.forEach(function (s) {
        var r = estimate(numParams, world, s, s.group === "shard" ? (shard || parseWhole(inputs.shard.value)) : null,
                         paramBytes, gradBytes, k, tp);
        if (r === null) return;
        var stack = el("td", {class: "mc-track"}, STATES.map(function (state) {
          var pct = scale > 0n ? Number(r[state] * 10000n / scale) / 100 : 0;
          return el("div", {class: "mc-bar mc-" + state, style: "width:" + pct + "%", title: t.state[state] + ": " + formatBytes(r[state], t)});
        }));
        var row = el("tr", {"data-strategy": s.name, class: s === strategy ? "mc-chosen" : ""}, [
          el("td", {}, [el("code", {text: s.name}), el("span", {class: "mc-zero", text: " " + s.zero})]),
          el("td", {text: s.sharded.length ? s.sharded.map(function (x) { return STATE_SHORT[lang][x]; }).join("+") + (s.group === "shard" ? " ÷ " + r.group : "") : t.sharded_none}),
          stack,
          el("td", {class: "mc-size", "data-bytes": r.total.toString(), text: formatBytes(r.total, t)}),
        ]);
        row.addEventListener("click", function () { inputs.strategy.value = s.name; render(); });
        all.appendChild(row);
      });
      out.appendChild(all);

      // the call that gives the same numbers
      var call = "estimate_memory(" + numParams.toString().replace(/\B(?=(\d{3})+(?!\d))/g, "_") + ", " + world +
        ", \"" + strategy.name + "\"" + (hybrid ? ", shard_size=" + shard : "") + ", param_bytes=" + paramBytes +
        ", grad_bytes=" + gradBytes + ", optimizer_bytes=" + k + (tp > 1n ? ", tp=" + tp : "") + ")";
      out.appendChild(el("p", {text: t.python}));
      out.appendChild(el("pre", {class: "mc-python"}, [el("code", {id: "mc-call", text: "from fsdp_mini import estimate_memory\n" + call})]));
    }

    form.addEventListener("input", render);
    form.addEventListener("change", render);
    reset.addEventListener("click", function () {
      inputs.params.value = DEFAULTS.params; inputs.world.value = DEFAULTS.world; inputs.tp.value = DEFAULTS.tp;
      inputs.strategy.value = DEFAULTS.strategy; inputs.shard.value = DEFAULTS.shard;
      inputs.param_dtype.value = DEFAULTS.param_dtype; inputs.grad_dtype.value = DEFAULTS.grad_dtype;
      inputs.optimizer.value = DEFAULTS.optimizer; inputs.state_dtype.value = DEFAULTS.state_dtype;
      inputs.master.checked = DEFAULTS.master;
      render();
    });
    render();
  }

  function start() {
    var root = document.getElementById("memory-calculator");
    if (root) build(root);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();

  // for tests and the curious: the same functions the page uses
  window.memoryCalculator = {parseCount: parseCount, estimate: estimate, formatBytes: formatBytes,
                             strategies: STRATEGIES, text: TEXT};
})();
