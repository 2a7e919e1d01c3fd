"""Evaluate an arithmetic expression safely (numbers, + - * / // % **, parentheses)."""

import ast
import operator

from pydantic import BaseModel, Field

from app.spec import ThreadState, define_tool

OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class Args(BaseModel):
    expression: str = Field(description="An arithmetic expression, e.g. `2 + 2 * 3`", max_length=200)


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        if isinstance(node.op, ast.Pow) and abs(_eval(node.right)) > 100:
            raise ValueError("exponent too large")
        return OPERATORS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


@define_tool(description="Evaluate an arithmetic expression and return the result.")
async def calculate(state: ThreadState, args: Args) -> str:
    value = _eval(ast.parse(args.expression, mode="eval"))
    return str(int(value) if float(value).is_integer() else value)
