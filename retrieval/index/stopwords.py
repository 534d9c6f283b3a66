"""English stopwords: function words that carry no topic. Shared by the rule extractor (which
words can be names, tags or content) and the lexical channel (which query words to match)."""

from __future__ import annotations

STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
herself him himself his how i if in into is it its itself just let me more most my myself no nor not now of \
off
on once only or other our ours ourselves out over own same she should so some such than that the their theirs
them themselves then there these they this those through to too under until up very was we were what when \
where
which while who whom why will with would you your yours yourself yourselves s t don didn doesn isn wasn aren
weren won wouldn couldn shouldn ll re ve d m it's that's what's i'm i've i'd i'll you're you've you'd you'll
there's here's let's can't don't didn't doesn't isn't wasn't won't
""".split())
