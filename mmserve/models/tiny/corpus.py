"""Deterministic built-in English corpus used to train the tiny presets' BPE tokenizer.

Nothing is downloaded: sentences are assembled from word lists and templates with a
fixed-seed ``random.Random`` so every build sees exactly the same text.
"""

from __future__ import annotations

import random

from .corpus_words import (
    ADJECTIVES,
    COLORS,
    DIGITS,
    NUMBERS,
    OBJECTS,
    PLACES,
    SHAPES,
    TIMES,
    VERBS,
    WEATHER,
)

QUESTIONS = (
    "What is in this image?",
    "What color is the {obj}?",
    "How many {obj}s are there?",
    "Where is the {obj}?",
    "Describe the image in detail.",
    "What shape is {place}?",
    "Is the {obj} {adj}?",
    "What is the {obj} doing?",
    "What time of day is it?",
    "What is the weather like?",
    "Can you see a {color} {shape}?",
    "Which object is {place}?",
    "Why is the {obj} {verb}?",
    "What does the picture show?",
    "Please describe the {shape} {place}.",
)
TEMPLATES = (
    "The image shows a {adj} {color} {obj} {place}.",
    "A {color} {shape} is drawn {place}.",
    "There are {num} {obj}s {verb} {place}.",
    "In this picture, a {adj} {obj} is {verb} {place}.",
    "The {obj} looks {adj} and {adj2} in the {time} light.",
    "It is a {weather} {time}, and a {obj} is {verb} {place}.",
    "I can see a {color} {obj} next to a {adj} {shape}.",
    "This photo was taken during the {time}; the sky is {weather}.",
    "The {shape} is {color}, and the {shape2} beside it is {color2}.",
    "A {adj} {obj} with {color} stripes is {verb} {place}.",
    "Most of the scene is {color}, with a {adj} {obj} {place}.",
    "The answer is {num}: there are {num} {color} {shape}s in the image.",
    "Yes, the {obj} is {adj}.",
    "No, the {obj} is not {color}; it is {color2}.",
    "The {obj} appears to be {verb}, while the {obj2} stays {place}.",
    "Someone placed a {color} {obj} {place}, which makes the picture feel {adj}.",
    "The {lex} in the picture is {color} and {adj}.",
    "Look at the {lex} {place}; it seems {lex2}.",
    "Caption: {lex}, {lex2}, {obj} and {shape}.",
)
LEXICON = """
photograph picture drawing sketch diagram chart graph screenshot poster banner label caption
texture pattern shadow reflection outline border edge corner surface background foreground
horizon landscape portrait cityscape skyline meadow valley canyon glacier volcano waterfall
harbor station airport stadium museum gallery theater hospital school university factory
warehouse farm barn cottage apartment skyscraper lighthouse windmill tunnel highway sidewalk
crosswalk parking lot traffic signal lantern candle mirror curtain carpet pillow blanket sofa
cabinet drawer shelf ladder bucket shovel hammer wrench scissors needle thread button zipper
pocket sleeve collar helmet glove scarf boots sandals necklace bracelet earring watch wallet
ticket envelope letter newspaper magazine notebook pencil marker crayon brush palette canvas
sculpture vase bowl spoon fork knife kettle teapot oven fridge sink faucet towel soap bathtub
carrot potato tomato onion pepper lettuce cucumber pumpkin cherry grape lemon melon peach pear
strawberry blueberry cookie bread cheese butter noodle rice soup salad burger sausage donut
chicken duck goose swan eagle owl parrot penguin dolphin whale shark octopus crab lobster frog
snake lizard spider beetle bee ant mouse squirrel deer fox wolf lion tiger leopard monkey
gorilla kangaroo koala panda camel donkey goat pig puppy kitten pony calf lamb
wheel engine bumper mirror headlight propeller anchor sail paddle canoe kayak yacht ferry
helicopter rocket satellite planet galaxy comet asteroid telescope microscope robot computer
keyboard monitor screen speaker headphones microphone battery cable charger printer scanner
tablet controller joystick remote antenna router server circuit sensor motor switch socket
player team coach referee crowd audience musician dancer painter teacher student doctor
nurse farmer soldier pilot sailor driver chef waiter baker builder artist writer scientist
family friend neighbor stranger visitor tourist shopper runner swimmer climber rider skater
morning weekend holiday festival parade concert wedding birthday party picnic journey trip
winter spring summer autumn season january february march april june july august october
rainbow thunder lightning snowflake icicle puddle raindrop breeze tornado hurricane drought
north south east west upward downward forward backward inside outside above below between
quickly slowly gently suddenly carefully quietly loudly happily sadly brightly softly nearly
almost probably certainly clearly roughly exactly perhaps maybe usually rarely often always
transparent reflective glossy matte metallic wooden velvet leather cotton woolen silky paper
symmetric asymmetric vertical horizontal diagonal parallel curved straight jagged pointed
crowded deserted peaceful chaotic elegant rustic vintage futuristic cozy spacious cramped
delicious fresh rotten ripe frozen melted burnt sweet sour bitter salty spicy crunchy
enormous gigantic miniature medium average typical unusual strange familiar famous ordinary
beautiful ugly pretty handsome charming lovely gorgeous plain fancy messy neat tidy
describe identify count compare notice observe examine explain suggest answer question
paint draw build carry hold throw catch kick push pull lift drop open close cover reveal
"""
LEX = tuple(dict.fromkeys(LEXICON.split()))


def _fill(rng: random.Random, template: str) -> str:
    """Fill one template with random (but seeded) words."""
    return template.format(
        adj=rng.choice(ADJECTIVES),
        adj2=rng.choice(ADJECTIVES),
        color=rng.choice(COLORS),
        color2=rng.choice(COLORS),
        obj=rng.choice(OBJECTS),
        obj2=rng.choice(OBJECTS),
        shape=rng.choice(SHAPES),
        shape2=rng.choice(SHAPES),
        place=rng.choice(PLACES),
        verb=rng.choice(VERBS),
        num=rng.choice(NUMBERS + DIGITS),
        time=rng.choice(TIMES),
        weather=rng.choice(WEATHER),
        lex=rng.choice(LEX),
        lex2=rng.choice(LEX),
    )


def _forms(word: str) -> list[str]:
    """Crude English inflections of ``word`` (plural, -ing, -ed, -er, -ly, capitalized)."""
    stem = word[:-1] if word.endswith("e") else word
    return [
        word,
        word + "s",
        stem + "ing",
        stem + "ed",
        stem + "er",
        word + "ly",
        word.capitalize(),
        word.upper(),
    ]


def build_corpus(num_lines: int = 3000, seed: int = 1234) -> list[str]:
    """Return ``num_lines`` deterministic lines of image/question/answer style English text."""
    rng = random.Random(seed)
    lines: list[str] = []
    # Every vocabulary word at least once, capitalized and not, so merges cover them all.
    for words in (COLORS, SHAPES, OBJECTS, ADJECTIVES, VERBS, WEATHER, TIMES, NUMBERS):
        lines.append(" ".join(words) + ".")
        lines.append(" ".join(w.capitalize() for w in words) + ".")
    for i in range(0, len(LEX), 4):
        forms = [f for w in LEX[i : i + 4] for f in _forms(w)]
        lines.append("Keywords: " + ", ".join(forms) + ".")
        lines.append(" ".join(forms))
    while len(lines) < num_lines:
        kind = rng.random()
        if kind < 0.3:
            question = _fill(rng, rng.choice(QUESTIONS))
            answer = _fill(rng, rng.choice(TEMPLATES))
            lines.append(f"USER: {question} ASSISTANT: {answer}")
        elif kind < 0.4:
            lines.append(f"Q: {_fill(rng, rng.choice(QUESTIONS))} A: {rng.choice(NUMBERS)}.")
        else:
            lines.append(_fill(rng, rng.choice(TEMPLATES)))
    return lines[:num_lines]
