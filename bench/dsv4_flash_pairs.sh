#!/usr/bin/env bash
# Issue #34 on one four-GPU host: ours and stock vLLM side by side, each on its own GPU pair with its own
# compile caches, started together (both cold), then measured in turn (ours, stock, stock, ours) so
# that neither client competes with the other. PHASES (default "tp2 ep"):
#   tp2   engine.tp=2            ours (triton_w4a16, GPUs 0,1) next to stock (marlin, GPUs 2,3); measured ours, stock,
#         then stock, ours again (a second round each) while MEASURE_S (default 300) is left to the deadline
#   ep    engine.tp=2 engine.ep=true, the same pairs (caches warm from tp2)
#   both  tp2 and ep in one start of stock: ours (TP=2) next to stock (TP=2), measured ours, stock; then
#         ours restarted with engine.ep=true on its GPUs while stock stays up, measured ours-EP, stock again
#         (stock's repeat). One DeepGEMM cache for both servers (their attention linears are the same:
#         what one client's untimed round compiles, the other's finds); everything else cold per server
#   seq   a two-GPU host (GPUs 0,1): ours (TP=2) started cold, measured, stopped; then stock (TP=2) on the
#         same GPUs, measured, stopped; then, while PHASE_S is left, ours with engine.ep=true, measured.
#         Every server has its own caches (each starts cold: neither finds what the other compiled, so
#         neither ready times nor rounds that compile favour the later one). SEQ_SHARED_CACHES=1 shares
#         TileLang's and DeepGEMM's (the same mHC kernels and attention linears: later starts are minutes
#         shorter, and a later server finds DeepGEMM kernels an earlier client compiled: say so with its figures)
#   seqep a two-GPU host (GPUs 0,1): ours with engine.tp=2 engine.ep=true, started cold and measured twice (the
#         second client run while MEASURE_S is left), stopped; then stock with the same settings, the same way;
#         then ours against stock, round by round. Caches as in seq (SEQ_SHARED_CACHES=1: say so with the figures)
#         PROFILE=1 (tp2, ep, seq, seqep, tp4): each server also runs one 2k-token prefill inside vLLM's torch profiler
#         after its client runs (one server at a time); every rank's kernel table goes to $FLASH_OUT/prof/<tag>/ and
#         into pairs.log
#   tp4   ours alone on GPUs 0-3: TP4 + EP with the MTP draft, batches 1, 32, 256 (CUDA graphs at TP4_CAPTURE tokens,
#         default 3,24,96,384,768: a batch's sequences x 3); if it never answers, once more without the draft
#   ref   who is right where ours and stock part: REF_LAYERS (default 8) layers, one GPU each, ours
#         (GPU 0), stock (GPU 1) and the fp32 torch_emulation MoE, eager (GPU 2), greedy and teacher-forced
#         only; prints ours and stock each against the reference. REF_GPUS="0 0 0" runs the three in turn on
#         one GPU (a one-GPU host)
# A phase starts only while DEADLINE (epoch seconds) is at least PHASE_S (default 600) away.
# Writes into FLASH_OUT (default /tmp/flash): serve logs, JSON, and pairs.log, the progress. On the
# device host: copy the tree to /tmp/repo (each call re-sends the working tree), start
# `setsid nohup bash bench/dsv4_flash_pairs.sh &` there, then poll pairs.log with calls that follow
# each other within the machine's 30 s idle release (a released machine takes every server with it).
set -uo pipefail
# Never the device tool's $OUT (emptied before every call while these servers run on): FLASH_OUT.
export OUT=${FLASH_OUT:-/tmp/flash} RUNS=${FLASH_OUT:-/tmp/flash}/runs
export CAPTURE=${CAPTURE:-1,8,32,128,256} MAX_SEQS=${MAX_SEQS:-256} BATCHES=${BATCHES:-1,8,32,128,256}
PHASES=${PHASES:-tp2 ep}
DEADLINE=${DEADLINE:-$(( $(date +%s) + 1500 ))}
S=bench/dsv4_flash_serve.sh
mkdir -p "$OUT" "$RUNS"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/pairs.log"; }
srv() { env $1 ACTION="$2" bash "$S"; }   # $1: the server's settings (VAR=value words)

time_left() {
    [ $(( DEADLINE - $(date +%s) )) -ge "${PHASE_S:-600}" ] || { log "skip $1: under ${PHASE_S:-600} s to the deadline"; return 1; }
}

measure_left() {   # $1 what comes next (a client run, a profile): it goes on while MEASURE_S is left
    [ $(( DEADLINE - $(date +%s) )) -ge "${MEASURE_S:-300}" ] ||
        { log "skip $1: under ${MEASURE_S:-300} s (MEASURE_S) to the deadline"; return 1; }
}

clear_runs() {   # $1 a phase: its earlier client runs' JSON gone, so that ratios compares this phase's runs only
    rm -f "$OUT/ours-$1"-r*.json "$OUT/stock-$1"-r*.json
}

tag() { echo "${1##*TAG=}"; }   # TAG= is the last word of a server's settings

up() {   # start every server given, wait for all of them together; READY: the settings of those that answer
    local s
    READY=()
    for s in "$@"; do srv "$s" start | tee -a "$OUT/pairs.log"; done
    for s in "$@"; do srv "$s" wait > "$OUT/$(tag "$s").wait" 2>&1 & done
    wait
    for s in "$@"; do
        cat "$OUT/$(tag "$s").wait" >> "$OUT/pairs.log"
        grep -q "ready after .*: yes" "$OUT/$(tag "$s").wait" && READY+=("$s")
    done
}

down() { local s; for s in "$@"; do srv "$s" stop; done; }

is_ready() { local s; for s in "${READY[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

measure() {   # $1 a server's settings, $2 the round; more VAR=value words go to the client
    local s=$1 r=$2
    shift 2
    env $s "$@" ROUND="-r$r" ACTION=measure bash "$S" >> "$OUT/pairs.log" 2>&1 || log "client failed: $(tag "$s")"
}

prof_word() {   # PROFILE=1: the PROFILE_DIR word of server $1's settings (empty otherwise)
    [ "${PROFILE:-0}" = 1 ] && echo "PROFILE_DIR=$OUT/prof/$1 "
}

profile() {   # PROFILE=1: one 2k prefill of server $1 (its settings) inside vLLM's profiler, while MEASURE_S is left
    [ "${PROFILE:-0}" = 1 ] || return 0
    measure_left "profile $(tag "$1")" || return 0
    log "profile $(tag "$1")"
    env $1 ACTION=profile bash "$S" >> "$OUT/pairs.log" 2>&1 || log "profile failed: $(tag "$1")"
}

ratios() {   # $1 phase: ours against stock, round by round, per cell (dsv4_flash_run.py ratio)
    local r
    for r in 1 2; do
        [ -f "$OUT/stock-$1-r$r.json" ] && [ -f "$OUT/ours-$1-r$r.json" ] || continue
        log "ours/stock, $1, round $r"
        python3 bench/dsv4_flash_run.py ratio "$OUT/stock-$1-r$r.json" "$OUT/ours-$1-r$r.json" >> "$OUT/pairs.log" 2>&1
    done
}

pair() {   # $1 phase name, $2 EP
    local phase=$1 ep=$2 o who
    clear_runs "$phase"
    local a="$(prof_word ours-$phase)CUDA_VISIBLE_DEVICES=0,1 PORT=8011 MOE=triton_w4a16 TP=2 EP=$ep CACHE=/tmp/cache-ours TAG=ours-$phase"
    local b="$(prof_word stock-$phase)CUDA_VISIBLE_DEVICES=2,3 PORT=8012 MOE=marlin TP=2 EP=$ep CACHE=/tmp/cache-stock TAG=stock-$phase"
    up "$a" "$b"
    local order=()
    is_ready "$a" && order+=("a 1")
    is_ready "$b" && order+=("b 1" "b 2")
    is_ready "$a" && order+=("a 2")
    for o in "${order[@]}"; do
        who=$a; [ "${o% *}" = b ] && who=$b
        [ "${o#* }" = 2 ] && ! measure_left "$(tag "$who") round 2" && continue
        log "measure $(tag "$who") round ${o#* }"
        measure "$who" "${o#* }"
    done
    for who in "$a" "$b"; do is_ready "$who" && profile "$who"; done   # one at a time: neither competes
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$OUT/pairs.log"
    down "$a" "$b"
    ratios "$phase"
    log "phase $phase done"
}

both() {   # tp2 and ep against one stock server (see "both" above)
    local dg="DG_CACHE=/tmp/cache-dg VLLM_DEEP_GEMM_WARMUP=${VLLM_DEEP_GEMM_WARMUP:-relax}"
    local a="$dg CUDA_VISIBLE_DEVICES=0,1 PORT=8011 MOE=triton_w4a16 TP=2 EP=false CACHE=/tmp/cache-ours TAG=ours-tp2"
    local b="$dg CUDA_VISIBLE_DEVICES=2,3 PORT=8012 MOE=marlin TP=2 EP=false CACHE=/tmp/cache-stock TAG=stock-tp2"
    local c="$dg CUDA_VISIBLE_DEVICES=0,1 PORT=8013 MOE=triton_w4a16 TP=2 EP=true CACHE=/tmp/cache-ours TAG=ours-ep"
    local stock_up=false
    up "$a" "$b"
    is_ready "$b" && stock_up=true
    is_ready "$a" && { log "measure ours-tp2"; measure "$a" 1; }
    $stock_up && { log "measure stock-tp2 round 1"; measure "$b" 1; }
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$OUT/pairs.log"
    down "$a"
    time_left ep || { down "$b"; return; }
    up "$c"
    is_ready "$c" && { log "measure ours-ep"; measure "$c" 1; }
    $stock_up && { log "measure stock-tp2 round 2"; measure "$b" 2; }
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$OUT/pairs.log"
    down "$c" "$b"
    log "phase both done"
}

gpus_released() {   # wait (up to 90 s) until GPUs 0,1 hold under 2 GiB each: a stopped server's memory is back
    local used=
    for _ in $(seq 1 90); do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0,1 2>/dev/null |
               awk -F', *' '$NF ~ /[0-9]/ {v = $NF; gsub(/[^0-9]/, "", v); if (v + 0 > m) m = v + 0; n++}
                            END {if (n) print m + 0}')   # nothing (no nvidia-smi, [N/A]): not released
        [ "${used:-99999}" -lt 2048 ] && return 0
        sleep 1
    done
    log "GPUs 0,1 still hold ${used:-?} MiB 90 s after the server stopped"
}

seq_server() {   # $1 a tag (ours-tp2 stock-tp2 ours-ep stock-ep): that server's settings on GPUs 0,1
    local who=${1%%-*} phase=${1#*-} moe=triton_w4a16 ep=false port=8011
    [ "$who" = stock ] && moe=marlin port=8012
    [ "$phase" = ep ] && ep=true port=$(( port + 2 ))
    echo "$(prof_word "$1")CUDA_VISIBLE_DEVICES=0,1 PORT=$port MOE=$moe TP=2 EP=$ep CACHE=/tmp/cache-$who TAG=$1"
}

phase_seq() {   # $1 the phase's name, $2 client runs a server (the second while MEASURE_S is left), then tags
    local name=$1 runs=$2 sh="VLLM_DEEP_GEMM_WARMUP=${VLLM_DEEP_GEMM_WARMUP:-relax}" t s r
    shift 2
    [ "${SEQ_SHARED_CACHES:-0}" = 1 ] && sh="TL_CACHE=/tmp/cache-tl DG_CACHE=/tmp/cache-dg $sh"
    for t in "$@"; do
        s="$sh $(seq_server "$t")"
        [ "$name" = seq ] && [ "$t" = ours-ep ] && { time_left ep || return; }
        [ "$name" = seqep ] && [ "$t" = stock-ep ] && { time_left stock-ep || return; }
        up "$s"
        if is_ready "$s"; then
            for r in $(seq 1 "$runs"); do
                [ "$r" -gt 1 ] && ! measure_left "$t round $r" && continue
                if [ "$runs" = 1 ]; then log "measure $t"; else log "measure $t round $r"; fi
                measure "$s" "$r"
            done
            profile "$s"
        fi
        nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >> "$OUT/pairs.log"
        down "$s"
        gpus_released
    done
    log "phase $name done"
}

log "start: phases '$PHASES', deadline in $(( DEADLINE - $(date +%s) )) s"
for p in $PHASES; do
    time_left "$p" || continue
    case $p in
    tp2) pair tp2 false ;;
    ep) pair ep true ;;
    both) both ;;
    seq) phase_seq seq 1 ours-tp2 stock-tp2 ours-ep ;;
    seqep) clear_runs ep; phase_seq seqep 2 ours-ep stock-ep; ratios ep ;;
    tp4)
        # the MTP draft makes every decode step 1 + 2 tokens a sequence: vLLM rounds CUDA-graph sizes up to
        # multiples of 3 and drops those past the largest, so batches 1/32/256 are captured as 3/96/768 tokens
        t="CUDA_VISIBLE_DEVICES=0,1,2,3 PORT=8013 MOE=triton_w4a16 TP=4 EP=true"
        m="$(prof_word ours-tp4)$t CAPTURE=${TP4_CAPTURE:-3,24,96,384,768} MTP=true CACHE=/tmp/cache-ours TAG=ours-tp4"
        up "$m"
        if is_ready "$m"; then
            measure "$m" 1 BATCHES=1,32,256
            measure_left "ours-tp4 round 2" && { log "measure ours-tp4 round 2"; measure "$m" 2 BATCHES=1,32,256; }
            profile "$m"
            grep -E "SpecDecoding metrics" "$RUNS/ours-tp4/vllm_server.log" | tail -3 | cut -c1-400 >> "$OUT/pairs.log"
            down "$m"
        else   # the draft is what TP4 + EP adds to the measured TP=2 runs: without it, still TP4 + EP
            down "$m"
            # one token a step again: CAPTURE's sizes (the 2026-11-27 start kept the draft's 3/96/768 here, so
            # batch 1 and 32 ran padded to 3 and 96 tokens and batch 256 on a mixed, piecewise graph)
            if time_left tp4-no-mtp; then
                log "ours-tp4 did not answer: TP4 + EP again without the MTP draft"
                n="$t MTP=false CACHE=/tmp/cache-ours TAG=ours-tp4-nomtp"
                up "$n"
                is_ready "$n" && measure "$n" 1 BATCHES=1,32,256
                down "$n"
            fi
        fi
        log "phase tp4 done"
        ;;
    ref)
        read -r g0 g1 g2 <<< "${REF_GPUS:-0 1 2}"
        together=true c0=/tmp/cache-ours c1=/tmp/cache-stock c2=/tmp/cache-ref
        # one GPU for all three (REF_GPUS="0 0 0"): in turn, sharing one compile cache, never two vLLM
        # memory profiles on one GPU at once
        [ "$g0" = "$g1" ] && [ "$g1" = "$g2" ] && together=false c0=/tmp/cache-ref c1=/tmp/cache-ref
        # correctness only (no timed round): DeepGEMM compiles what the prompts use, not its 1,690 warm-up
        # kernels (about 25 minutes on a 16-core host, 2026-11-27), and two graph sizes do for batch 1
        q="VLLM_DEEP_GEMM_WARMUP=skip CAPTURE=1,8 MAX_SEQS=8"
        r0="$q CUDA_VISIBLE_DEVICES=$g0 PORT=8021 MOE=triton_w4a16 TP=1 LAYERS=${REF_LAYERS:-8} CACHE=$c0 TAG=ours-ref"
        r1="$q CUDA_VISIBLE_DEVICES=$g1 PORT=8022 MOE=marlin TP=1 LAYERS=${REF_LAYERS:-8} CACHE=$c1 TAG=stock-ref"
        r2="$q CUDA_VISIBLE_DEVICES=$g2 PORT=8023 MOE=torch_emulation TP=1 LAYERS=${REF_LAYERS:-8} EAGER=true CACHE=$c2 TAG=fp32-ref"
        if $together; then
            up "$r0" "$r1" "$r2"
            for s in "$r0" "$r1" "$r2"; do is_ready "$s" && measure "$s" 1 BATCHES=1 ROUNDS=1 PREFILL=0; done
            down "$r0" "$r1" "$r2"
        else
            for s in "$r0" "$r1" "$r2"; do
                up "$s"
                is_ready "$s" && measure "$s" 1 BATCHES=1 ROUNDS=1 PREFILL=0
                down "$s"
            done
        fi
        for who in ours stock; do
            log "$who against the fp32 reference MoE"
            python3 bench/dsv4_flash_run.py compare "$OUT/fp32-ref-r1.json" "$OUT/$who-ref-r1.json" >> "$OUT/pairs.log" 2>&1
        done
        log "ours against stock"
        python3 bench/dsv4_flash_run.py compare "$OUT/stock-ref-r1.json" "$OUT/ours-ref-r1.json" >> "$OUT/pairs.log" 2>&1
        log "phase ref done"
        ;;
    *) log "unknown phase $p (valid: tp2 ep both seq seqep tp4 ref)" ;;
    esac
done
log "all done"
