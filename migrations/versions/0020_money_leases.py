"""money: credit leases (holds.lease, calls.lease_id, treg_place_hold's headroom, treg_close_leased)

A serving process that places many holds for one (org, member, tag) takes a **credit lease** instead: one
hold (``holds.lease``) for many calls' worth, placed only while the limits leave a headroom beside it,
from which its calls take their holds in memory, without a round trip (docs/money.md "Credit leases").
Each leased call's close inserts the call's own hold row, already closed, and moves its amount out of
the lease, in one statement for many calls (``treg_close_leased``); the lease's remainder is released
like any hold (``treg_close_holds``) when the process is done with it, or by the reaper after a crash,
which then marks the calls it covered whose close was never written (``calls.lease_id``) as released.

Revision ID: 0020
Revises: 0019
"""
from alembic import op
import sqlalchemy as sa

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

_PLACE_0015 = ("text, text, text, text, bigint, double precision, bigint, text, bigint, text")
_PLACE_0020 = _PLACE_0015 + ", bigint, boolean"
_AMOUNTS_0002 = "amount_micro > 0 AND settled_micro >= 0 AND settled_micro <= amount_micro"
_AMOUNTS_0020 = "(amount_micro > 0 OR lease) AND amount_micro >= 0 AND settled_micro >= 0 AND settled_micro <= amount_micro"

PLACE_HOLD = r"""
CREATE OR REPLACE FUNCTION treg_place_hold(
    p_call text, p_org text, p_member text, p_tag text, p_amount bigint, p_ttl_s double precision,
    p_trial bigint, p_trial_grant_id text, p_extra_cap bigint, p_credit_org text, p_headroom bigint,
    p_lease boolean)
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
    -- what must fit under every limit: the amount, and for a credit lease the headroom left beside it
    v_need bigint := p_amount + greatest(coalesce(p_headroom, 0), 0);
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
    IF v_need > v_avail THEN
        RETURN QUERY SELECT 'balance'::text, p_amount, v_avail, NULL::bigint, NULL::timestamptz, today;
        RETURN;
    END IF;
    SELECT coalesce(sum(d.spent_micro + d.held_micro) FILTER (WHERE d.scope = '*'), 0),
           coalesce(sum(d.spent_micro + d.held_micro) FILTER (WHERE d.scope = p_member), 0)
      INTO v_org_used, v_member_used
      FROM money_daily d
     WHERE d.org_id = p_org AND d.day = today AND (d.scope = '*' OR d.scope = p_member);
    IF acct.daily_cap_micro IS NOT NULL AND v_org_used + v_need > acct.daily_cap_micro THEN
        RETURN QUERY SELECT 'daily_cap'::text, p_amount, acct.daily_cap_micro - v_org_used,
                            acct.daily_cap_micro, NULL::timestamptz, today;
        RETURN;
    END IF;
    IF p_extra_cap IS NOT NULL AND v_org_used + v_need > p_extra_cap THEN
        RETURN QUERY SELECT 'extra_cap'::text, p_amount, p_extra_cap - v_org_used, p_extra_cap,
                            NULL::timestamptz, today;
        RETURN;
    END IF;
    IF p_tag IS NOT NULL THEN
        SELECT t.budget_micro, t.spent_micro, t.held_micro INTO v_tag
          FROM tag_budgets t WHERE t.org_id = p_org AND t.tag = p_tag;
        IF FOUND AND v_tag.budget_micro IS NOT NULL
           AND v_need > v_tag.budget_micro - v_tag.spent_micro - v_tag.held_micro THEN
            RETURN QUERY SELECT 'tag_budget'::text, p_amount,
                                v_tag.budget_micro - v_tag.spent_micro - v_tag.held_micro, v_tag.budget_micro,
                                NULL::timestamptz, today;
            RETURN;
        END IF;
    END IF;
    IF p_member IS NOT NULL THEN
        SELECT c.daily_cap_micro INTO v_mcap FROM member_caps c WHERE c.member_id = p_member;
        IF v_mcap IS NOT NULL AND v_member_used + v_need > v_mcap THEN
            RETURN QUERY SELECT 'member_cap'::text, p_amount, v_mcap - v_member_used, v_mcap,
                                NULL::timestamptz, today;
            RETURN;
        END IF;
    END IF;
    INSERT INTO holds (id, org_id, member_id, tag, day, amount_micro, state, expires_at, credit_org_id, lease)
         VALUES (p_call, p_org, p_member, p_tag, today, p_amount, 'held', v_expires, p_credit_org,
                 coalesce(p_lease, false));
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

CLOSE_LEASED = r"""
CREATE OR REPLACE FUNCTION treg_close_leased(p_leases text[], p_calls text[], p_states text[], p_amounts bigint[],
                                             p_observed bigint[])
RETURNS TABLE (closed_id text, closed_org text, closed_state text, closed_amount bigint, closed_charged bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    l record;
    r record;
    v_amount bigint;
    v_charged bigint;
BEGIN
    -- the leases' orgs locked first, in one order, as every money writer takes them
    PERFORM 1 FROM org_balances b
      WHERE b.org_id IN (SELECT x.org_id FROM holds x WHERE x.id = ANY(p_leases) AND x.lease)
      ORDER BY b.org_id FOR UPDATE;
    FOR l IN SELECT x.id, x.org_id, x.member_id, x.tag, x.day, x.amount_micro, x.state, x.expires_at
               FROM holds x WHERE x.id = ANY(p_leases) AND x.lease ORDER BY x.id FOR UPDATE LOOP
        v_amount := 0;
        v_charged := 0;
        -- each call's own hold row, inserted closed (once: a second close of a call inserts nothing); a
        -- lease no longer held (released by the reaper after a crash) charged them nothing
        FOR r IN
            INSERT INTO holds AS h (id, org_id, member_id, tag, day, amount_micro, state, settled_micro,
                                    expires_at, closed_at)
            SELECT c.call, l.org_id, l.member_id, l.tag, l.day, c.amount,
                   CASE WHEN l.state = 'held' THEN c.state ELSE 'released' END,
                   CASE WHEN l.state = 'held' AND c.state = 'settled'
                        THEN least(greatest(c.observed, 0), c.amount) ELSE 0 END,
                   l.expires_at, now()
              FROM unnest(p_leases, p_calls, p_states, p_amounts, p_observed) AS c(lease, call, state, amount, observed)
             WHERE c.lease = l.id
            ON CONFLICT (id) DO NOTHING
            RETURNING h.id, h.state, h.amount_micro, h.settled_micro
        LOOP
            v_amount := v_amount + r.amount_micro;
            v_charged := v_charged + r.settled_micro;
            closed_id := r.id; closed_org := l.org_id; closed_state := r.state;
            closed_amount := r.amount_micro; closed_charged := r.settled_micro;
            RETURN NEXT;
        END LOOP;
        IF l.state = 'held' AND v_amount > 0 THEN
            IF v_amount > l.amount_micro THEN
                RAISE EXCEPTION 'credit lease % overdrawn: % closed against % left', l.id, v_amount, l.amount_micro;
            END IF;
            -- the calls' amounts move out of the lease: the totals' held down, settled up by the charges
            UPDATE holds x SET amount_micro = x.amount_micro - v_amount WHERE x.id = l.id;
            UPDATE org_balances b
               SET held_micro = b.held_micro - v_amount, settled_micro = b.settled_micro + v_charged,
                   updated_at = now()
             WHERE b.org_id = l.org_id;
            UPDATE money_daily d
               SET held_micro = d.held_micro - v_amount, spent_micro = d.spent_micro + v_charged
             WHERE d.org_id = l.org_id AND d.day = l.day AND (d.scope = '*' OR d.scope = l.member_id);
            IF l.tag IS NOT NULL THEN
                UPDATE tag_budgets t
                   SET held_micro = t.held_micro - v_amount, spent_micro = t.spent_micro + v_charged
                 WHERE t.org_id = l.org_id AND t.tag = l.tag;
            END IF;
        END IF;
    END LOOP;
END
$fn$;
"""


def upgrade() -> None:
    op.add_column('holds', sa.Column('lease', sa.Boolean(), server_default=sa.text('false'), nullable=False))
    # a lease's amount is what is left of it: 0 once its last call's amount moved out
    op.drop_constraint(op.f('ck_holds_amounts'), 'holds', type_='check')
    op.create_check_constraint(op.f('ck_holds_amounts'), 'holds', _AMOUNTS_0020)
    op.add_column('calls', sa.Column('lease_id', sa.String(200), nullable=True))
    op.create_index('ix_calls_lease_id', 'calls', ['lease_id'], unique=False,
                    postgresql_where=sa.text('lease_id IS NOT NULL'))
    op.execute(f"DROP FUNCTION IF EXISTS treg_place_hold({_PLACE_0015})")
    op.execute(PLACE_HOLD)
    op.execute(CLOSE_LEASED)


def downgrade() -> None:
    import importlib.util
    import pathlib

    op.execute("DROP FUNCTION IF EXISTS treg_close_leased(text[], text[], text[], bigint[], bigint[])")
    op.execute(f"DROP FUNCTION IF EXISTS treg_place_hold({_PLACE_0020})")
    # 0015's function again, as 0015 wrote it
    spec = importlib.util.spec_from_file_location("_m0015", pathlib.Path(__file__).with_name("0015_money_functions.py"))
    m0015 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m0015)
    op.execute(m0015.PLACE_HOLD)
    op.execute("DELETE FROM holds WHERE lease AND amount_micro = 0")  # spent leases: no 0002 row has 0
    op.drop_constraint(op.f('ck_holds_amounts'), 'holds', type_='check')
    op.create_check_constraint(op.f('ck_holds_amounts'), 'holds', _AMOUNTS_0002)
    op.drop_index('ix_calls_lease_id', table_name='calls')
    op.drop_column('calls', 'lease_id')
    op.drop_column('holds', 'lease')
