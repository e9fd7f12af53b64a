"""The web app (`scripts/app.py`): complete, highlight and browse the experiments of a checkpoint repository.

- `offline.py`: switch off everything Gradio would contact beyond loopback (import it before `gradio`);
- `models.py`: the bounded cache of loaded models, keyed by checkpoint commit;
- `whole_number.py`: a request's count or seed field as an int, or its one-line refusal;
- `workspace.py`: what every tab shares: the repository reference, the cache, one-line error handling;
- `background.py`: a request's long work on a thread that stops when its client cancels or leaves;
- `pickers.py`: the branch + checkpoint dropdowns; `losses.py`: validation loss vs tokens seen, several branches;
- `complete.py`, `infill.py` (fill-in-the-middle), `highlight.py`, `experiments.py`, `data.py`: one tab each;
- `server.py`: the Blocks page and `serve()`.

Gradio is imported lazily by the tab modules (an optional, heavy dependency); the rest of the project never
imports this package.
"""
