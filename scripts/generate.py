"""Complete code with a checkpoint, streaming tokens to the terminal as they are generated.

    python scripts/generate.py --model REPO [--revision BRANCH_OR_COMMIT] --prompt "def fib(n):"
    echo "def fib(n):" | python scripts/generate.py --model REPO --prompt -
    python scripts/generate.py --model REPO --prompt-file stub.py --num-return-sequences 3 --seed 0

The prompt is EOS + the stripped prompt and a completion ends at EOS or at the first HumanEval stop string
(\\nclass, \\ndef, \\n#, \\n@, \\nprint, \\nif), exactly as `scripts/human_eval.py` scores it, so what you see
here is what HumanEval would execute. Sample 1 streams live; further samples are printed when done.
"""

from __future__ import annotations

import argparse
import random
import sys

from codeparrot.errors import run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="model repository: a local checkpoint repository (path), a Hub id (user/name), or a plain "
                        "folder that from_pretrained loads")
    p.add_argument("--revision", default=None, help="branch (experiment), tag or commit to load (default: main)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text; '-' reads it from stdin")
    src.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate per sample (default 128)")
    p.add_argument("--temperature", type=float, default=0.2,
                   help="sampling temperature; 0 = greedy decoding (default 0.2, HumanEval's)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95); no top-k cut")
    p.add_argument("--num-return-sequences", type=int, default=1, help="samples to draw (default 1)")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed; same seed, device and software give the same samples (default: a fresh "
                        "seed, printed so the run can be repeated)")
    p.add_argument("--no-stop", action="store_true",
                   help="do not stop at HumanEval's stop strings (EOS and --max-new-tokens still end a sample)")
    p.add_argument("--no-strip", action="store_true",
                   help="keep the prompt's leading/trailing whitespace (HumanEval strips it)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    p.add_argument("--output", default=None, help="also write the samples and settings to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no live streaming; print the samples when done")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    from codeparrot.atomic_io import atomic_write_json
    from codeparrot.inference.completion import (
        CompletionStreamer,
        format_samples,
        generate_completions,
        read_prompt,
        timed_generation,
    )
    from codeparrot.repository.model import load_model_and_tokenizer

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar between prompt and output
    prompt = read_prompt(args.prompt, args.prompt_file)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    model, tokenizer = load_model_and_tokenizer(args.model, args.revision, args.device)
    shown_prompt = prompt if args.no_strip else prompt.strip()
    n = args.num_return_sequences

    streamer = None
    if not args.quiet:  # the streamer shows the header and prompt once generation really starts
        header = f"──── sample 1/{n} (live) ────\n" if n > 1 else ""
        streamer = CompletionStreamer(tokenizer, stop=not args.no_stop, prefix=header + shown_prompt)
    completions, seconds = timed_generation(lambda: generate_completions(
        model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, num_return_sequences=n, seed=seed, stop=not args.no_stop,
        strip_prompt=not args.no_strip, streamer=streamer))
    if streamer is not None:
        if not (shown_prompt + streamer.text).endswith("\n"):
            print()
        if streamer.text != completions[0].text:  # cannot happen unless decoding is not prefix-stable
            print("warning: the live stream differs from the final sample 1; the final one is:", file=sys.stderr)
            print(format_samples(shown_prompt, completions[:1]))
        if n > 1:
            print()
            print(format_samples(shown_prompt, completions, start=1), end="")
    else:
        print(format_samples(shown_prompt, completions), end="")

    total = sum(c.num_tokens for c in completions)
    reasons = ", ".join(f"{c.stop_reason}" for c in completions)
    print(f"[{n} sample(s), {total} tokens in {seconds:.2f} s ({total / max(seconds, 1e-9):.1f} tokens/s); "
          f"seed {seed}; ended by: {reasons}]", file=sys.stderr)
    if args.output:
        atomic_write_json(args.output, {
            "model": args.model, "revision": args.revision, "prompt": prompt, "seed": seed,
            "settings": {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                         "top_p": args.top_p, "num_return_sequences": n, "stop": not args.no_stop,
                         "strip_prompt": not args.no_strip},
            "seconds": round(seconds, 3),
            "completions": [{"completion": c.text, "num_tokens": c.num_tokens, "stop_reason": c.stop_reason}
                            for c in completions]})
    return 0


if __name__ == "__main__":
    run_cli(main)
