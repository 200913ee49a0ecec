"""The HTTP server: Quart-trio handlers on Hypercorn that translate HTTP into engine messages.

* :mod:`~modelc.server.serve`       ``modelc run``: Hypercorn + the engine in one trio nursery
* :mod:`~modelc.server.app`         the app factory, request hooks, the one error handler
* :mod:`~modelc.server.schemas`     the bodies every dialect shares (limits, messages, tools, sampling)
* :mod:`~modelc.server.errors`      exceptions -> HTTP status + OpenAI error object
* :mod:`~modelc.server.generation`  prompts, sampling and constraints -> GenerationRequest; the
  one stream loop that every dialect's renderer answers through
* :mod:`~modelc.server.tools`       tool offering, tool_choice constraints, tool-call parsing
* :mod:`~modelc.server.conversation` messages + tools + tool_choice -> prompt ids and constraint
  (the chat, Messages and Responses routes)
* one package per API dialect, each ``schemas.py`` (its bodies), ``routes.py`` (parse,
  submit, answer) and ``render.py`` (its renderer): ``openai``, ``ollama``, ``llamacpp``,
  ``native``, ``anthropic`` (Messages), ``responses`` (OpenAI Responses, with its
  bounded in-memory ``store.py``)
* :mod:`~modelc.server.cors`        CORS headers from the ``cors_origins`` setting
* :mod:`~modelc.server.sse`, :mod:`~modelc.server.auth`, :mod:`~modelc.server.metrics`,
  :mod:`~modelc.server.logging`, :mod:`~modelc.server.openapi`, ``static/chat.html``
"""
