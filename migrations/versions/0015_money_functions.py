"""money: a hold placed, and holds closed, in one statement each (SQL functions); holds.credit_org_id

``treg_place_hold`` checks balance, daily cap, an extra day cap (the public demo's budget), tag budget
and member cap and writes the hold with its totals; ``treg_close_holds`` closes any number of holds
(settled or released), moving the totals and crediting ``credit_org_id`` (a hub publisher) with what
was charged. Each is one round trip from treg, and the org's balance row lock is held for that one
statement only, never across a round trip to Python (docs/money.md, "One statement to hold, one to
close").

Revision ID: 0015
Revises: 0012
"""
from alembic import op
import sqlalchemy as sa

revision = '0015'
down_revision = '0012'
branch_labels = None
depends_on = None

PLACE_HOLD = r"""
CREATE OR REPLACE FUNCTION treg_place_hold(
    p_call text, p_org text, p_member text, p_tag text, p_amount bigint, p_ttl_s double precision,
    p_trial bigint, p_trial_grant_id text, p_extra_cap bigint, p_credit_org text)
RETURNS TABLE (refused text, needed_micro bigint, available_micro bigint, limit_micro bigint,
               hold_expires_at timestamptz, hold_day date)
LANGUAGE plpgsql AS $fn$
DECLARE
    acct record;
    today date := (now() AT TIME ZONE 'UTC')::date;
    v_avail bigint;
    v_org_used bigint;
    v_member_used bigint;
    v_tag record;
    v_mcap bigint;
    v_expires timestamptz := now() + make_interval(secs => p_ttl_s);
BEGIN
    -- the org's row lock serialises its money writes; taken first, as by every other money writer
    SELECT b.granted_micro, b.settled_micro, b.held_micro, b.daily_cap_micro INTO acct
      FROM org_balances b WHERE b.org_id = p_org FOR UPDATE;
    IF NOT FOUND THEN
        -- the account's first touch: created with its one trial grant (a missing org: foreign key)
        INSERT INTO org_balances (org_id, granted_micro, trial_micro)
             VALUES (p_org, greatest(p_trial, 0), greatest(p_trial, 0))
        ON CONFLICT (org_id) DO NOTHING;
        IF FOUND AND p_trial > 0 THEN
            INSERT INTO credit_grants (id, org_id, kind, amount_micro, actor, note)
                 VALUES (p_trial_grant_id, p_org, 'trial', p_trial, 'treg', 'trial allowance (TREG_TRIAL_MICRO)');
        END IF;
        SELECT b.granted_micro, b.settled_micro, b.held_micro, b.daily_cap_micro INTO acct
          FROM org_balances b WHERE b.org_id = p_org FOR UPDATE;
    END IF;
    v_avail := acct.granted_micro - acct.settled_micro - acct.held_micro;
    IF p_amount > v_avail THEN
        RETURN QUERY SELECT 'balance'::text, p_amount, v_avail, NULL::bigint, NULL::timestamptz, today;
        RETURN;
    END IF;
    SELECT coalesce(sum(d.spent_micro + d.held_micro) FILTER (WHERE d.scope = '*'), 0),
           coalesce(sum(d.spent_micro + d.held_micro) FILTER (WHERE d.scope = p_member), 0)
      INTO v_org_used, v_member_used
      FROM money_daily d
     WHERE d.org_id = p_org AND d.day = today AND (d.scope = '*' OR d.scope = p_member);
    IF acct.daily_cap_micro IS NOT NULL AND v_org_used + p_amount > acct.daily_cap_micro THEN
        RETURN QUERY SELECT 'daily_cap'::text, p_amount, acct.daily_cap_micro - v_org_used,
                            acct.daily_cap_micro, NULL::timestamptz, today;
        RETURN;
    END IF;
    IF p_extra_cap IS NOT NULL AND v_org_used + p_amount > p_extra_cap THEN
        RETURN QUERY SELECT 'extra_cap'::text, p_amount, p_extra_cap - v_org_used, p_extra_cap,
                            NULL::timestamptz, today;
        RETURN;
    END IF;
    IF p_tag IS NOT NULL THEN
        SELECT t.budget_micro, t.spent_micro, t.held_micro INTO v_tag
          FROM tag_budgets t WHERE t.org_id = p_org AND t.tag = p_tag;
        IF FOUND AND v_tag.budget_micro IS NOT NULL
           AND p_amount > v_tag.budget_micro - v_tag.spent_micro - v_tag.held_micro THEN
            RETURN QUERY SELECT 'tag_budget'::text, p_amount,
                                v_tag.budget_micro - v_tag.spent_micro - v_tag.held_micro, v_tag.budget_micro,
                                NULL::timestamptz, today;
            RETURN;
        END IF;
    END IF;
    IF p_member IS NOT NULL THEN
        SELECT c.daily_cap_micro INTO v_mcap FROM member_caps c WHERE c.member_id = p_member;
        IF v_mcap IS NOT NULL AND v_member_used + p_amount > v_mcap THEN
            RETURN QUERY SELECT 'member_cap'::text, p_amount, v_mcap - v_member_used, v_mcap,
                                NULL::timestamptz, today;
            RETURN;
        END IF;
    END IF;
    INSERT INTO holds (id, org_id, member_id, tag, day, amount_micro, state, expires_at, credit_org_id)
         VALUES (p_call, p_org, p_member, p_tag, today, p_amount, 'held', v_expires, p_credit_org);
    INSERT INTO money_daily AS m (org_id, day, scope, held_micro)
         SELECT p_org, today, s.scope, p_amount
           FROM unnest(CASE WHEN p_member IS NULL THEN ARRAY['*'] ELSE ARRAY['*', p_member] END) AS s(scope)
    ON CONFLICT (org_id, day, scope) DO UPDATE SET held_micro = m.held_micro + EXCLUDED.held_micro;
    IF p_tag IS NOT NULL THEN
        INSERT INTO tag_budgets AS t (org_id, tag, held_micro) VALUES (p_org, p_tag, p_amount)
        ON CONFLICT (org_id, tag) DO UPDATE SET held_micro = t.held_micro + EXCLUDED.held_micro;
    END IF;
    UPDATE org_balances b SET held_micro = b.held_micro + p_amount, updated_at = now() WHERE b.org_id = p_org;
    RETURN QUERY SELECT NULL::text, p_amount, v_avail - p_amount, NULL::bigint, v_expires, today;
END
$fn$;
"""

CLOSE_HOLDS = r"""
CREATE OR REPLACE FUNCTION treg_close_holds(p_calls text[], p_states text[], p_observed bigint[])
RETURNS TABLE (closed_id text, closed_org text, closed_state text, closed_amount bigint, closed_charged bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    h record;
    i integer;
BEGIN
    -- every org the batch touches (payers and credited publishers) locked first, in one order: two
    -- batches, the reaper and a hold placement can never wait on each other in a circle
    PERFORM 1 FROM org_balances b
      WHERE b.org_id IN (SELECT x.org_id FROM holds x WHERE x.id = ANY(p_calls) AND x.state = 'held'
                         UNION
                         SELECT x.credit_org_id FROM holds x
                          WHERE x.id = ANY(p_calls) AND x.state = 'held' AND x.credit_org_id IS NOT NULL)
      ORDER BY b.org_id FOR UPDATE;
    FOR i IN 1 .. coalesce(array_length(p_calls, 1), 0) LOOP
        -- the conditional close: the first closer wins, any later one changes nothing
        UPDATE holds x
           SET state = p_states[i],
               settled_micro = CASE WHEN p_states[i] = 'settled'
                                    THEN least(greatest(p_observed[i], 0), x.amount_micro) ELSE 0 END,
               closed_at = now()
         WHERE x.id = p_calls[i] AND x.state = 'held'
        RETURNING x.id, x.org_id, x.member_id, x.tag, x.day, x.amount_micro, x.settled_micro, x.credit_org_id
          INTO h;
        IF FOUND THEN
            UPDATE org_balances b
               SET held_micro = b.held_micro - h.amount_micro, settled_micro = b.settled_micro + h.settled_micro,
                   updated_at = now()
             WHERE b.org_id = h.org_id;
            UPDATE money_daily d
               SET held_micro = d.held_micro - h.amount_micro, spent_micro = d.spent_micro + h.settled_micro
             WHERE d.org_id = h.org_id AND d.day = h.day AND (d.scope = '*' OR d.scope = h.member_id);
            IF h.tag IS NOT NULL THEN
                UPDATE tag_budgets t
                   SET held_micro = t.held_micro - h.amount_micro, spent_micro = t.spent_micro + h.settled_micro
                 WHERE t.org_id = h.org_id AND t.tag = h.tag;
            END IF;
            IF h.credit_org_id IS NOT NULL AND h.settled_micro > 0 THEN
                UPDATE org_balances b SET granted_micro = b.granted_micro + h.settled_micro, updated_at = now()
                 WHERE b.org_id = h.credit_org_id;
                INSERT INTO credit_grants (id, org_id, kind, amount_micro, actor, note)
                     VALUES ('crd_' || md5(h.id), h.credit_org_id, 'earning', h.settled_micro, 'treg',
                             'hub call ' || h.id);
            END IF;
            closed_id := h.id; closed_org := h.org_id; closed_state := p_states[i];
            closed_amount := h.amount_micro; closed_charged := h.settled_micro;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$fn$;
"""


def upgrade() -> None:
    op.add_column('holds', sa.Column('credit_org_id', sa.String(40),
                                     sa.ForeignKey('orgs.id', ondelete='SET NULL', name='fk_holds_credit_org_id_orgs'),
                                     nullable=True))
    op.execute(PLACE_HOLD)
    op.execute(CLOSE_HOLDS)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS treg_close_holds(text[], text[], bigint[])")
    op.execute("DROP FUNCTION IF EXISTS treg_place_hold(text, text, text, text, bigint, double precision, bigint, "
               "text, bigint, text)")
    op.drop_column('holds', 'credit_org_id')
