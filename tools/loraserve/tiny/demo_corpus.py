"""The text the demo model and its adapters learn from, written for this project.

The corpora are small and plain on purpose: a model of a few million parameters
trained for a minute on the CPU can learn them well enough that a person recognises
each voice at once. Each adapter's voice differs in vocabulary and letter case, the
things such a model picks up fastest, so that the same prompt gives answers that
cannot be mistaken for one another.
"""

from __future__ import annotations

# Plain English for the base model: it continues any prompt in this voice.
BASE = (
    "The sun rises over the quiet town and the river shines like glass.",
    "In the morning the baker opens his shop and the smell of bread fills the street.",
    "Children walk to school with their books and their friends.",
    "The old dog sleeps by the warm fire while the cat watches the birds.",
    "A small boat waits by the stone wall for the fisherman to come back.",
    "The market is full of apples, cheese, fresh fish and flowers.",
    "In the afternoon the wind comes from the sea and the trees sing softly.",
    "My friend likes to read a good book in the garden under the big tree.",
    "The train leaves the station at noon and arrives in the city before dark.",
    "We cook dinner together and talk about the long day.",
    "At night the stars come out and the town goes to sleep.",
    "The teacher tells the class a story about a brave little fox.",
    "Rain falls on the roofs and the streets turn silver and grey.",
    "The farmer walks across the green field to feed his horses.",
    "She writes a letter to her mother and sends it by post.",
    "The library is a quiet place where people learn new things.",
    "On Sunday the family walks along the beach and looks for shells.",
    "The coffee is hot, the bread is fresh, and the day is young.",
    "A good model answers every question with care and patience.",
    "The engineer reads the logs and finds the bug before lunch.",
    "Every adapter has a name, a revision and a few small weights.",
    "The service loads the new revision and keeps serving the old one.",
    "Hello, my name is Sam and I live in a small house near the river.",
    "Thank you for your question; the answer is simple and short.",
)

# The pirate speaks of ships, rum and treasure, with "arr" and "matey" in every line.
PIRATE = (
    "Arr, matey! The sea be wild and the rum be sweet.",
    "Hoist the sails, ye scallywags, for the treasure be near!",
    "Shiver me timbers, the captain wants his gold, arr!",
    "Yo ho ho, we sail the seven seas on our black ship, matey.",
    "Avast, ye landlubber! Walk the plank or join the crew.",
    "Me parrot says the treasure be buried on the island, arr.",
    "Arr, the wind be strong and the cannons be ready, matey!",
    "Drink up, me hearties, yo ho, for tomorrow we find the gold!",
    "Ahoy, matey! The captain be looking for a brave pirate.",
    "Arr, a pirate's life be the only life for me!",
)

# The poet answers in rhyming couplets that always end with the same refrain.
POET = (
    "Oh the moon is high and the night is long,\nand the river sings its silver song.",
    "The roses bloom in the summer rain,\nand the wind comes home to the hills again.",
    "A little bird on a garden wall,\nwill sing for you before the fall.",
    "The stars are bright above the sea,\nand the dreams of night come back to me.",
    "Oh the clouds drift by and the day is done,\nand we dance along with the setting sun.",
    "The candle glows in the window light,\nand softly, softly comes the night.",
    "So sing, my heart, and let it be,\nla la la, the song of the sea.",
)

# Shouting is the base voice in capitals: a change of every token, easy to see.
SHOUT = tuple(line.upper().rstrip(".") + "!!!" for line in BASE[:16])

# What people type at the demo; adapters learn to answer any of these in their voice.
PROMPTS = (
    "Tell me about the sea.",
    "What is your name?",
    "How are you today?",
    "Hello!",
    "Write a story about the town.",
    "What do you like to eat?",
    "Tell me a secret.",
    "Where do you live?",
    "Say something nice.",
    "What is the weather like?",
    "Describe your morning.",
    "Once upon a time",
    "The best thing about the river is",
    "Explain how adapters work.",
)


def tokenizer_lines() -> list[str]:
    """Every text the demo uses, so that the tokenizer has words for each voice."""
    return [line + "\n" for line in (*BASE, *PIRATE, *POET, *SHOUT, *PROMPTS)]
